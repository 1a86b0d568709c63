"""The one options object of a tuning run, shared by ``apply_and_build``, ``fastdlight.tune``,
the CLI and ``ApplyFastTuning``: each passes it through unchanged.

    opts = TuneOptions(budget_ms=50, check="all")
    apply_and_build(func, configs, arch, options=opts)
    apply_and_build(func, configs, arch, budget_ms=50)        # same: keywords become fields

Every field is validated when the object is made, so a bad value (``timeout=0``,
``budget_ms=-5``, an unknown keyword) fails at once with one line, before anything is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

#: seconds one candidate may take to schedule + lower + compile before its worker is killed
DEFAULT_TIMEOUT = 120.0
#: timing budget of the finalists: their median is taken over at least this many milliseconds
DEFAULT_BUDGET_MS = 100.0
#: timing budget of the first pass over every candidate, which only has to find the finalists
#: (the few fastest, timed again hot at ``budget_ms``). With NVRTC builds a model's tuning is
#: GPU-bound: on an H100, LLaMA 1x512 tuned in 22.8 s at 10 ms against 24.5 s at 25 ms, and
#: ran 0.1245 ms against 0.1246 (2026-11-26); at 10 ms the first pass's replays took 10.7 of
#: efficientnet_b0's 79 s (H200, 940 candidates): a 0.25 ms graph replayed 20 times is enough
DEFAULT_SCREEN_MS = 5.0
CHECKS = ("winner", "all", "none")
TIMINGS = ("rotate", "flush")


@dataclass(frozen=True)
class RpcSpec:
    """Where the GPU is: ``host:port`` of an RPC server, or of a tracker with ``key``."""

    host: str
    port: int
    key: str = ""

    @classmethod
    def parse(cls, text: str) -> RpcSpec:
        parts = str(text).split(":")
        if len(parts) not in (2, 3) or not parts[0] or not parts[1].isdigit() or not 0 < int(parts[1]) < 65536:
            raise ValueError(f"--rpc {text!r}: expected HOST:PORT (a server) or HOST:PORT:KEY (a tracker and a key)")
        return cls(parts[0], int(parts[1]), parts[2] if len(parts) == 3 else "")

    def __str__(self) -> str:
        return f"{self.host}:{self.port}" + (f":{self.key}" if self.key else "")


def parse_devices(value) -> tuple[int, ...]:
    """``"0,1"`` or ``(0, 1)`` as a tuple of distinct GPU indices; ValueError in one line."""
    items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    try:
        out = tuple(int(str(v).strip()) for v in items) if items is not None else ()
    except ValueError:
        out = ()
    if not out or any(d < 0 for d in out) or len(set(out)) != len(out):
        raise ValueError(f"devices {value!r}: expected distinct GPU indices, e.g. 0,1")
    return out


@dataclass(frozen=True)
class TuneOptions:
    """How to build, time and check candidates.

    measure: time on the GPU (None: when a GPU is present). Without measuring, candidates are
        compiled to cubins and ranked by the policy's predicted cost.
    parallel_build: compile in worker processes (crash- and hang-proof); False: in this process.
    max_workers: build processes (None: one per CPU). timeout: seconds per candidate build.
    budget_ms: timing budget of each finalist (the fastest few of the first pass, timed again).
    screen_ms: timing budget of the first pass over every candidate (at most ``budget_ms``).
    timing: "rotate" or "flush" (see tune.measure).
    check: "winner" (fastest first, then the next, until one verifies), "all", "none".
    ref: float64 numpy reference ``ref(*inputs) -> output(s)``; None: the PrimFunc itself,
        widened to float64 under a naive schedule (:mod:`fastdlight.measure.verify`).
    probe: run each candidate (and the reference) once in a separate process before it runs
        here, so a kernel that faults or hangs costs only itself.
    seed: random inputs. workload: device inputs to share with other measurements.
    template / hook: test and extension points (template(func, config) -> Schedule; hook(index,
        config) runs in the worker before scheduling); both must be module-level functions.
    progress: progress bars (None: when stderr is a terminal). verbose: print the table.
    recheck_database: on a GPU, build, time and verify a stored config again before using it.
        Off by default: a record was verified when stored, and its key pins the function, the
        GPU, the TVM version and the template's source, so a replay only re-applies schedules.
    memory_bound_topk: at most this many of the CUDA-core policy's configs for an elementwise
        function or a reduction, whose first config is as good as the best of many
        (:func:`fastdlight.policies.select.default_configs`); None: ``topk``.
    rpc: ``"HOST:PORT"`` (a ``python -m fastdlight.rpc_server``) or ``"HOST:PORT:KEY"`` (a TVM
        tracker and the key its servers registered): candidates are built here and timed and
        verified on that server's GPU (:mod:`fastdlight.search.remote`).
    devices: GPUs of this machine (``(0, 1)`` or ``"0,1"``) to time on: each function on the one
        of them timing the fewest functions when it starts (:mod:`fastdlight.measure.gpu_turns`);
        None: GPU 0 only.
    """

    measure: bool | None = None
    parallel_build: bool = True
    max_workers: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    budget_ms: float = DEFAULT_BUDGET_MS
    screen_ms: float = DEFAULT_SCREEN_MS
    timing: str = "rotate"
    check: str = "winner"
    ref: Callable | None = None
    probe: bool = True
    seed: int = 0
    workload: Any = None
    template: Callable | None = None
    hook: Callable | None = None
    pool: Any = None
    progress: bool | None = None
    verbose: bool = False
    recheck_database: bool = False
    #: 4, not more: the first config was the winner or within 3% of it wherever it was measured
    #: (see ``default_configs``), and a CNN is mostly such functions (ConvNeXtV2-atto: 50 of 69,
    #: whose timings made most of its 96 s cold tune on an H200)
    memory_bound_topk: int | None = 4
    rpc: str | None = None
    devices: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.check not in CHECKS:
            raise ValueError(f"check must be one of {CHECKS}, got {self.check!r}")
        if self.timing not in TIMINGS:
            raise ValueError(f"timing must be one of {TIMINGS}, got {self.timing!r}")
        for name in ("timeout", "budget_ms", "screen_ms"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of {'seconds' if name == 'timeout' else 'ms'}, "
                                 f"got {value!r}")
        if self.rpc is not None:
            RpcSpec.parse(self.rpc)  # one line naming the expected forms
        if self.devices is not None:
            object.__setattr__(self, "devices", parse_devices(self.devices))
            if self.rpc is not None and len(self.devices) > 1:
                raise ValueError("devices and rpc: time on this machine's GPUs or on a remote one, not both")
        for name in ("max_workers", "memory_bound_topk"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @classmethod
    def of(cls, options: TuneOptions | None = None, **overrides) -> TuneOptions:
        """``options`` with ``overrides`` applied; an unknown keyword is a TypeError naming it."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unknown tuning option(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        base = options if options is not None else cls()
        return dataclasses.replace(base, **overrides) if overrides else base

    def replace(self, **changes) -> TuneOptions:
        return TuneOptions.of(self, **changes)
