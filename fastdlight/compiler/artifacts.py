"""What a build worker is asked for and what it hands back (pickled across the process
boundary): :class:`BuildRequest` in, :class:`BuildArtifact` (with its :class:`BuildPhases`) out."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from fastdlight.config import Config


@dataclass(frozen=True)
class BuildRequest:
    """What a build worker needs for one candidate (pickled across the process boundary).
    ``config`` None means: build the reference (the naive float64 schedule of the function)."""

    key: int | str
    func_json: str
    target: str
    config: Config | None
    out_dir: str
    want_module: bool
    template: Callable | None = None
    hook: Callable | None = None


@dataclass(frozen=True)
class BuildPhases:
    """Where a build's time went, in seconds (start_s/end_s: epoch seconds, show queueing)."""

    schedule_s: float = 0.0
    compile_s: float = 0.0  # lower + CUDA compile (NVRTC or nvcc)
    export_s: float = 0.0
    start_s: float = 0.0
    end_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.schedule_s + self.compile_s + self.export_s


@dataclass(frozen=True)
class BuildArtifact:
    """A compiled candidate: CUDA source, ptxas numbers, the cubin and, for GPU runs, the path
    of the exported library (or the scheduled module's JSON when export failed)."""

    key: int | str
    source: str
    registers: int
    spill_bytes: int
    shared_bytes: int
    cubin: bytes = dataclasses.field(repr=False)
    ptxas_log: str = dataclasses.field(default="", repr=False)
    so_path: str | None = None
    mod_json: str | None = dataclasses.field(default=None, repr=False)
    export_error: str | None = None
    phases: BuildPhases = BuildPhases()
    #: the PrimFunc (JSON) whose signature the probe makes inputs for: the function tuned, or
    #: for the reference its float64 twin
    probe_func_json: str | None = dataclasses.field(default=None, repr=False)
