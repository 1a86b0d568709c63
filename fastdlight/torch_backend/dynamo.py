"""The dynamo backend: a graph and its example inputs in, a callable on torch tensors out.

Static graphs compile when dynamo hands them over. A graph dynamo traced with symbolic sizes
(it does so after a shape changed) compiles once per set of sizes, on the first call with
them. A graph that cannot be exported, imported or compiled, or whose device TVM cannot run
on, runs eagerly instead, with one :class:`EagerFallbackWarning` saying why.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

import torch
from torch import fx

from fastdlight.compiler.compile import DEPENDENT_LAUNCH
from fastdlight.schedules.dependency import RELEASE_EARLY
from fastdlight.torch_backend.graph import (
    Signature,
    Unsupported,
    first_line,
    host_weights,
    is_dynamic,
    output_dtypes,
    signature,
    to_relax,
)
from fastdlight.torch_backend import programs
from fastdlight.torch_backend.programs import program_key
from fastdlight.torch_backend.runtime import NoDevice, Program, Settings, compile_program, device_of

#: the name ``torch.compile(backend=...)`` knows it by (the ``torch_dynamo_backends`` entry point)
NAME = "fastdlight"


class EagerFallbackWarning(UserWarning):
    """A graph runs eagerly (in torch) because fastdlight could not compile it."""


def backend(gm: fx.GraphModule, example_inputs, options: dict | None = None):
    """The ``torch.compile`` backend: ``torch.compile(model, backend="fastdlight")``, or
    ``backend=fastdlight.torch_backend.backend``. ``options`` (``torch.compile(...,
    options={...})``) are :class:`.runtime.Settings`."""
    settings = Settings.of(options)
    try:
        sig = signature(gm, example_inputs)
        _check_inference(example_inputs, sig)
        graph = CompiledGraph(gm, sig, settings)
        if not is_dynamic(example_inputs):
            graph.compile_static(example_inputs)
        return graph
    except Unsupported as e:
        _warn_eager(e, settings)
        return gm.forward


def _check_inference(example_inputs, sig: Signature) -> None:
    """Compiled graphs run forward only: a graph traced while autograd records (grad mode on,
    a parameter or input that requires grad) would lose its gradients."""
    if torch.is_grad_enabled() and any(example_inputs[i].requires_grad for i in sig.weights + sig.activations):
        raise Unsupported("autograd is recording and fastdlight compiles inference only "
                          "(call the model under torch.no_grad() or torch.inference_mode())")


def _warn_eager(error: Unsupported, settings: Settings) -> None:
    if not settings.fallback:
        raise error
    warnings.warn(f"fastdlight: running a graph eagerly: {error}", EagerFallbackWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The ``stacklevel`` (for a ``warnings.warn`` in the caller) of the first frame outside
    fastdlight and torch: the user's line that called the compiled model."""
    ours = tuple(os.path.dirname(path) + os.sep for path in (os.path.dirname(os.path.abspath(__file__)), torch.__file__))
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(ours):
        frame, level = frame.f_back, level + 1
    return level


class CompiledGraph:
    """``gm`` compiled for its activations' shapes: one program for a static graph (dynamo's
    guards recompile on a new shape), one per call signature for a dynamic one. Weights are
    copied to the host when the first program compiles; a static graph lets the copies go once
    its program is built."""

    def __init__(self, gm: fx.GraphModule, sig: Signature, settings: Settings):
        self.gm, self.sig, self.settings = gm, sig, settings
        output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        self.returns_tuple = isinstance(output.args[0], (tuple, list))
        self.out_dtypes = output_dtypes(gm)  # now: dynamo may drop its records once it compiled
        self.static = None  # the program of a static graph: no lookup per call
        self.programs: dict[tuple, object] = {}  # key -> Program, or gm where it could not compile
        self.weights = None
        self.lock = threading.Lock()  # two threads meeting a new shape compile it once

    def compile_static(self, args) -> None:
        """Compile for ``args`` now (raising :class:`Unsupported`): dynamo's guards make sure
        every call has their shapes."""
        self.static = self._compile(args)
        self.weights = None

    def __call__(self, *args):
        program = self.static or self._lookup(args)
        if program is self.gm:  # could not compile: eager
            return program(*args)
        out = program(*(args[i] for i in self.sig.activations))
        return out if self.returns_tuple else out[0]

    def _lookup(self, args):
        key = self.sig.key(args)
        program = self.programs.get(key)
        if program is None:
            with self.lock:
                if key not in self.programs:
                    try:
                        self.programs[key] = self._compile(args)
                    except Unsupported as e:
                        _warn_eager(e, self.settings)
                        self.programs[key] = self.gm
                program = self.programs[key]
        return program

    def _compile(self, args):
        weights = [args[i] for i in self.sig.weights]
        activations = [args[i] for i in self.sig.activations]
        devices = {t.device for t in weights + activations}
        if len(devices) > 1:
            raise NoDevice(f"the graph's tensors are on several devices ({', '.join(sorted(map(str, devices)))})")
        device = devices.pop() if devices else torch.device("cpu")
        dev, target = device_of(device)
        floats = {t.dtype for t in weights + activations if t.is_floating_point()}
        fp16 = self.settings.fp16 if self.settings.fp16 is not None else torch.float16 in floats
        fp16_io = fp16 and floats == {torch.float16}  # a .half() model takes and returns fp16: no casts at the edges
        key = None
        if self.settings.database is not None:  # a persistent cache: programs are kept beside the tunings
            key = program_key(self.gm, self.sig, args, target, {"fp16": fp16, "fp16_io": fp16_io,
                                                                 "tuning": self.settings.tuning,
                                                                 "dependent_launch": DEPENDENT_LAUNCH,
                                                                 "early_release": RELEASE_EARLY})
            stored = programs.load(key, dev)
            if stored is not None:
                return Program(stored.main, device, stored.in_dtypes, self.out_dtypes, cuda_graph=self.settings.cuda_graph)
        if self.weights is None:
            self.weights = host_weights(weights)
        mod = to_relax(self.gm, self.sig, args, self.weights)
        try:
            program = compile_program(mod, self.weights, device, self.settings, fp16=fp16, fp16_io=fp16_io,
                                      out_dtypes=self.out_dtypes)
        except Unsupported:
            raise
        except Exception as e:  # noqa: BLE001 - a pipeline or build error: the graph still runs, eagerly
            raise Unsupported(f"compiling for {device} failed: {first_line(e)}") from e
        if key is not None:
            programs.store(key, program.executable, program.in_dtypes)
        return program
