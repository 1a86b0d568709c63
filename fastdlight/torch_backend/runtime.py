"""A Relax module compiled for the device of a graph's tensors, called with torch tensors.

Every module goes through ``for_inference`` (weights bound, fp16 where the model is). On a CUDA
device it then goes through ``compile_model`` (prepare, ApplyFastTuning with the persistent
database, build); on the CPU, through TVM's default pipeline for the host: a working program,
not a tuned one (fastdlight tunes GPU kernels only).

Calls pass torch tensors straight to the VM: TVM's FFI takes them through DLPack without a
copy, runs the kernels on torch's current CUDA stream of their device (it sets the stream it
reads from torch for the duration of the call), and hands the outputs back as torch tensors
that own TVM's memory.

On a GPU a program replays from a CUDA graph (``cuda_graph``, the default): the first call
runs it twice on a side stream, so that TVM's memory pool holds every buffer a call takes, then
captures one call on static copies of the activations (a driver-API graph:
:mod:`fastdlight.measure.driver_graph`). Later calls copy the activations in,
replay, and return the graph's outputs without a copy; an output the caller still holds when the
next call comes gets a copy of its own then (:class:`LentOutputs`: the graph writes the same
memory every replay). A graph that cannot be captured runs its calls
as launches, with one log line saying why. Called while torch captures a CUDA graph of its own
(``torch.cuda.graph``, ``mode="reduce-overhead"`` around it), a program adds its graph to that
one as a node (the activations' copies in and the outputs' aliases as in a replay).
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
import tvm
import tvm_ffi
from tvm import relax

from fastdlight.arch import CUDA
from fastdlight.relax import ApplyFastTuning, compile_model, for_inference
from fastdlight.measure.cuda_events import ensure_context
from fastdlight.measure.driver_graph import DriverGraph
from fastdlight.torch_backend.cache import database_dir
from fastdlight.torch_backend.graph import Unsupported, first_line

log = logging.getLogger("fastdlight.torch_backend")


class NoDevice(Unsupported):
    """TVM cannot run on the device the graph's tensors are on."""


@dataclass(frozen=True)
class Settings:
    """What ``torch.compile(..., options={...})`` may say. ``fp16``: compute in fp16 with fp32
    accumulation (default: when the graph has fp16 tensors, as a ``.half()`` model does; an fp32
    model stays fp32). ``database``: the tuning database's directory (default: the cache's,
    :func:`.cache.database_dir`; ``False``: none). ``fallback``: run a graph that cannot be
    compiled eagerly, with a warning (``False``: raise). Other keys are ``ApplyFastTuning``
    keywords (``topk``, ``budget_ms``, ...)."""

    fp16: bool | None = None
    database: Path | None = None
    fallback: bool = True
    tuning: dict = field(default_factory=dict)
    cuda_graph: bool = True

    @classmethod
    def of(cls, options: dict | None) -> Settings:
        options = dict(options or {})
        fp16 = options.pop("fp16", None)
        if fp16 not in (None, True, False):
            raise ValueError(f"fp16 must be True, False or None, got {fp16!r}")
        database = options.pop("database", None)
        if database is None:
            database = database_dir()
        elif database is False:
            database = None
        else:
            database = Path(database)
        fallback = options.pop("fallback", True)
        cuda_graph = options.pop("cuda_graph", True)
        for key in ("target", "meta_database_dir"):
            if key in options:
                raise TypeError(f"{key!r} is set by the backend: the tensors' device is the target"
                                if key == "target" else f"{key!r}: give 'database' instead")
        ApplyFastTuning(**options)  # an unknown or bad keyword is refused now, not at the first GPU graph
        return cls(fp16, database, bool(fallback), options, bool(cuda_graph))


class Program:
    """The compiled module: ``program(*activations)`` returns the outputs as a tuple of torch
    tensors. Activations whose dtype is not the program's are cast (a copy; a bf16 graph runs
    in fp32), as are outputs whose dtype is not the graph's. ``report``: the tuning report's
    rows (GPU only)."""

    def __init__(self, main, device: torch.device, in_dtypes, out_dtypes=None, report=(), cuda_graph=False,
                 executable=None):
        self.main, self.device, self.report = main, device, list(report)
        self.executable = executable  # what a program cache stores (None: loaded from one)
        self.in_dtypes, self.out_dtypes = tuple(in_dtypes), out_dtypes
        self.replay = GraphReplay(self._run, device) if cuda_graph and device.type == "cuda" else None

    def __call__(self, *activations):
        # DLPack carries strides, but the kernels index compact buffers
        args = [a.to(dtype).contiguous() for a, dtype in zip(activations, self.in_dtypes)]
        out = self.replay(args) if self.replay is not None else self._run(*args)
        if self.out_dtypes is None:
            return out
        return tuple(o.to(dtype) for o, dtype in zip(out, self.out_dtypes))

    def _run(self, *args) -> tuple:
        out = self.main(*args)
        return as_torch(out) if isinstance(out, (tvm_ffi.Array, list, tuple)) else (as_torch(out),)


class GraphReplay:
    """``run`` (a program's call on compact activations) replayed from a CUDA graph captured at
    the first call (see the module docstring); :attr:`why_not` says why calls run as launches."""

    def __init__(self, run, device: torch.device):
        self.run, self.device = run, device
        self.graph: DriverGraph | None = None
        self.inputs: list[torch.Tensor] = []
        self.outputs: tuple = ()
        self.why_not: str | None = None
        self.lent = LentOutputs()

    def __call__(self, args) -> tuple:
        capturing = torch.cuda.is_current_stream_capturing()
        if self.graph is None and self.why_not is None and not capturing:
            try:
                self._capture(args)
            except Exception as e:  # noqa: BLE001 - launches still give the right result
                self.graph, self.why_not = None, first_line(e)
                log.info("fastdlight: a program runs without a CUDA graph: %s", self.why_not)
        if self.graph is None:
            return self.run(*args)
        self.lent.reclaim()
        for static, a in zip(self.inputs, args):
            static.copy_(a)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        if capturing:  # the caller captures a graph of its own: ours goes into it whole
            self.graph.add_to_capture(stream)
        else:
            self.graph.launch(stream)
        return self.lent.lend(self.outputs)

    def _capture(self, args) -> None:
        self.inputs = [a.clone() for a in args]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # TVM's pool then holds every buffer a call allocates
                self.run(*self.inputs)
            ensure_context(self.device.index or 0)

            def call():
                self.outputs = self.run(*self.inputs)

            self.graph = DriverGraph(call, side.cuda_stream)
        torch.cuda.current_stream(self.device).wait_stream(side)


class LentOutputs:
    """The graph's output buffers handed to the caller without a copy: each call returns new
    tensors aliasing them, and before the next replay overwrites the buffers, any of those the
    caller still holds is given storage of its own (a copy of what it holds now, in place of
    the alias: ``Tensor.set_``). A caller that is done with an output before the next call (a
    serving loop, a benchmark) costs no copy at all; one that keeps it sees it unchanged."""

    def __init__(self):
        self.handed: list[weakref.ref] = []

    def lend(self, buffers) -> tuple:
        out = tuple(torch.empty(0, dtype=b.dtype, device=b.device).set_(b.untyped_storage(), b.storage_offset(),
                                                                         b.shape, b.stride()) for b in buffers)
        self.handed = [weakref.ref(t) for t in out]
        return out

    def reclaim(self) -> None:
        for ref in self.handed:
            held = ref()
            if held is not None:
                held.set_(held.clone())
        self.handed = []


def as_torch(value):
    """``value`` (a tensor or a nest of them) as torch tensors, without copies. The FFI already
    returns torch tensors when it was called with torch tensors; a call without one (a graph of
    weights only) returns TVM's."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tvm_ffi.Array, list, tuple)):
        return tuple(as_torch(v) for v in value)
    if isinstance(value, (tvm_ffi.Tensor, tvm.runtime.Tensor)):
        return torch.utils.dlpack.from_dlpack(value)
    raise TypeError(f"the compiled graph returned a {type(value).__name__}, not tensors")


def device_of(device: torch.device):
    """(TVM's device for torch's ``device``, the name of the target built for it); NoDevice
    where TVM cannot run there."""
    if device.type == "cpu":
        return tvm.cpu(), str(_host_target())
    if device.type != "cuda":
        raise NoDevice(f"fastdlight runs graphs on CUDA GPUs and the CPU, not on {device.type}")
    index = torch.cuda.current_device() if device.index is None else device.index
    dev = tvm.cuda(index)
    if not dev.exist:
        raise NoDevice(f"TVM sees no CUDA GPU {index} (no GPU, or a TVM built without CUDA)")
    arch = CUDA.from_device(dev)
    return dev, f"{arch.target} {arch.device_name}"


def compile_program(mod: tvm.IRModule, weights, device: torch.device, settings: Settings, *, fp16: bool,
                    fp16_io: bool = False, out_dtypes=None) -> Program:
    """``mod`` (``main(*activations, *weights)``) with ``weights`` (host torch tensors) bound,
    compiled for ``device``; ``fp16``, ``fp16_io``: as ``for_inference``'s; ``out_dtypes``: the
    dtypes the outputs are handed back in."""
    start = time.perf_counter()
    dev, _ = device_of(device)
    params = [tvm.runtime.from_dlpack(w) for w in weights]
    mod = for_inference(mod, params, fp16=fp16, fp16_io=fp16_io)
    in_dtypes = [getattr(torch, str(p.ty.dtype)) for p in mod["main"].params]
    if device.type == "cpu":
        executable, report = tvm.compile(mod, target=_host_target()), ()
    else:
        arch = CUDA.from_device(dev)
        executable, _tuned, report = compile_model(mod, arch, tuning=tuning_for(arch, dev.index, settings))
    main = relax.VirtualMachine(executable, dev)["main"]
    log.info("compiled a graph for %s in %.1f s%s", device, time.perf_counter() - start, _summary(report))
    return Program(main, device, in_dtypes, out_dtypes, report, cuda_graph=settings.cuda_graph, executable=executable)


def tuning_for(arch: CUDA, index: int, settings: Settings) -> ApplyFastTuning:
    """The tuning of a graph whose tensors are on GPU ``index``: timed on that GPU, unless the
    backend's options name ``devices`` themselves."""
    return ApplyFastTuning(target=arch, meta_database_dir=settings.database,
                           **{"devices": (index,), **settings.tuning})


def _host_target():
    return tvm.target.Target.from_device(tvm.cpu())  # the host's own instruction set


def _summary(report) -> str:
    if not report:
        return ""
    counts: dict[str, int] = {}
    for row in report:
        counts[row.status] = counts.get(row.status, 0) + 1
    return " (" + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) + ")"
