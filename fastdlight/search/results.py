"""The values that pass between the phases of a tuning run.

    BuildRequest ──build──▶ BuildArtifact ──probe/measure──▶ Timing ──verify──▶ Verdict
                     └──────────────▶ Failure (stage, one line, full log) at any phase

A :class:`CompileResult` is one candidate's row: its config plus whatever the phases returned.
Each phase returns a new row (``dataclasses.replace``); nothing is mutated in place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fastdlight.compiler.artifacts import BuildArtifact, BuildPhases
from fastdlight.config import Config
from fastdlight.measure.timing import Timing

#: the stages a candidate can fail in, in pipeline order (the short reason in summaries)
STAGES = ("schedule", "lower", "nvcc", "export", "timeout", "crash", "probe", "load", "run", "verify")


@dataclass(frozen=True)
class Failure:
    stage: str
    message: str  # one line, starting with the stage
    log: str = dataclasses.field(default="", repr=False)

    @classmethod
    def of(cls, stage: str, message: str, log: str = "") -> Failure:
        line = (message.strip().splitlines() or [""])[0]
        return cls(stage, line if line.startswith(f"{stage}") else f"{stage}: {line}", log)


@dataclass(frozen=True)
class CompileResult:
    """One candidate and what happened to it. The attributes callers read (``source``,
    ``registers``, ``latency_ms``, ``verified``, ``error``, ...) are views of the phase values;
    ``origin`` says whether it was tuned in this run or replayed from a database."""

    config: Config
    index: int  # position of ``config`` in the list given to apply_and_build
    artifact: BuildArtifact | None = None
    failure: Failure | None = None
    timing: Timing | None = None
    verdict: Any = None  # fastdlight.measure.verify.Verdict, or None when not checked
    module: Any = dataclasses.field(default=None, repr=False, compare=False)  # loaded runtime module
    build_seconds: float = 0.0
    #: where the config came from: "tuned" (a candidate of this run) or "database" (a stored
    #: winner; unless rechecked it is not rebuilt: no artifact, and ``latency_ms`` is the stored time)
    origin: str = "tuned"
    _func: Any = dataclasses.field(default=None, repr=False, compare=False)
    _template: Any = dataclasses.field(default=None, repr=False, compare=False)

    def replace(self, **changes) -> CompileResult:
        return dataclasses.replace(self, **changes)

    def failed(self, stage: str, message: str, log: str = "") -> CompileResult:
        return self.replace(failure=Failure.of(stage, message, log))

    # -- views ------------------------------------------------------------------------------
    @property
    def compiled(self) -> bool:
        """nvcc produced a cubin for the target's arch."""
        return self.artifact is not None

    @property
    def replayed(self) -> bool:
        """A database winner taken as stored: neither built nor timed in this run."""
        return self.origin == "database" and self.artifact is None

    @property
    def ok(self) -> bool:
        return self.compiled and self.failure is None and self.verified is not False

    @property
    def source(self) -> str | None:
        return self.artifact.source if self.artifact else None

    @property
    def registers(self) -> int | None:
        return self.artifact.registers if self.artifact else None

    @property
    def spill_bytes(self) -> int | None:
        return self.artifact.spill_bytes if self.artifact else None

    @property
    def shared_bytes(self) -> int | None:
        return self.artifact.shared_bytes if self.artifact else None

    @property
    def latency_ms(self) -> float | None:
        return self.timing.median_ms if self.timing and self.failure is None else None

    @property
    def speed_key(self) -> tuple[int, float]:
        """Fastest first, the finalists' hot timings before every first-pass one: a hot timing
        is 5-15% slower on an H100, so a first-pass time beside it would win for being cold.
        Only for timed results."""
        return (0 if self.timing.hot else 1, self.latency_ms)

    @property
    def verified(self) -> bool | None:
        return None if self.verdict is None else bool(self.verdict.ok)

    @property
    def check_message(self) -> str:
        return self.verdict.message if self.verdict is not None else ""

    @property
    def error(self) -> str | None:
        return self.failure.message if self.failure else None

    @property
    def log(self) -> str:
        if self.failure:
            return self.failure.log
        return self.artifact.ptxas_log if self.artifact else ""

    @property
    def predicted_cost(self) -> float:
        return self.config.cost

    @property
    def build_phases(self) -> BuildPhases | None:
        return self.artifact.phases if self.artifact else None

    @property
    def schedule(self):
        """The ``s_tir.Schedule`` of this candidate (re-applied in this process)."""
        # (deferred: the build task loads the compiler and 60-odd modules more; a result is read
        # and written without them)
        from fastdlight.compiler import build_task

        return build_task.apply_template(self._func, self.config, self._template) if self._func is not None else None

    def to_dict(self) -> dict:
        """JSON form for ``--json`` (a report format, not an interchange between phases)."""
        phases = dataclasses.asdict(self.build_phases) if self.build_phases else {}
        return {
            "index": self.index, "config": self.config.to_dict(), "predicted_cost": self.predicted_cost,
            "latency_ms": self.latency_ms, "verified": self.verified, "check": self.check_message or None,
            "registers": self.registers, "spill_bytes": self.spill_bytes, "shared_bytes": self.shared_bytes,
            "error": self.error, "build_time_s": round(self.build_seconds, 3),
            "build_phases": {k: round(v, 3) for k, v in phases.items()},
        }  # fmt: skip
