"""A graph dynamo hands a backend, as a Relax module.

Dynamo passes a model's parameters and buffers as graph inputs, beside the activations and the
integer sizes of a graph traced with dynamic shapes. :func:`signature` tells them apart;
:func:`to_relax` specializes the graph to one call's sizes, exports it with ``torch.export``
and imports it with the weights last, so ``for_inference`` binds them as constants. Through
``torch.export`` (core ATen ops) TVM 0.27 imported the dynamo graphs of all 16 models of
``benchmarks/zoo_models.py``; its FX importer, given dynamo's ``torch.*`` calls, imported one.
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass

import torch
import tvm
from torch import fx
from tvm.relax.frontend.torch import from_exported_program
from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter


class Unsupported(Exception):
    """The graph cannot be compiled; the message names the op or the reason."""


@dataclass(frozen=True)
class Signature:
    """Positions of the graph's inputs: ``weights`` (parameters and buffers, bound as constants
    when the graph compiles), ``activations`` (tensors passed at every call) and ``sizes``
    (symbolic integers of a dynamic-shape graph: each call's values specialize it)."""

    weights: tuple[int, ...]
    activations: tuple[int, ...]
    sizes: tuple[int, ...]

    def key(self, args) -> tuple:
        """What a compiled program is specialized to: the activations' shapes, dtypes and
        devices, and the sizes' values."""
        return (tuple((tuple(args[i].shape), args[i].dtype, args[i].device) for i in self.activations),
                tuple(int(args[i]) for i in self.sizes))


def signature(gm: fx.GraphModule, example_inputs) -> Signature:
    """Which of ``gm``'s inputs are weights, activations and sizes. Dynamo records where each
    input came from only while it compiles the graph: called later, buffers count as
    activations."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise Unsupported(f"the graph has {len(placeholders)} inputs but {len(example_inputs)} examples")
    weights, activations, sizes = [], [], []
    for i, (node, example) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(example, torch.Tensor):
            if not isinstance(example, (int, torch.SymInt)):
                raise Unsupported(f"input {node.name} is a {type(example).__name__}, not a tensor or size")
            sizes.append(i)
        elif _is_weight(node, example):
            weights.append(i)
        else:
            activations.append(i)
    return Signature(tuple(weights), tuple(activations), tuple(sizes))


def _is_weight(node: fx.Node, example: torch.Tensor) -> bool:
    """A parameter, or a buffer of a module (BatchNorm's running statistics)."""
    if isinstance(example, torch.nn.Parameter):
        return True
    grapharg = node.meta.get("grapharg")
    if grapharg is None:
        return False
    try:
        from torch._dynamo.source import is_from_unspecialized_param_buffer_source
    except ImportError:  # a torch that names its sources otherwise: buffers stay inputs
        return False
    return is_from_unspecialized_param_buffer_source(grapharg.source)


def is_dynamic(example_inputs) -> bool:
    """Whether dynamo traced the graph with symbolic sizes (then each call's sizes specialize it)."""
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return True
        if isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in x.shape):
            return True
    return False


class _Specialized(torch.nn.Module):
    """``gm`` called with activations then weights; the sizes fixed to one call's values."""

    def __init__(self, gm: fx.GraphModule, sig: Signature, fixed: dict[int, int]):
        super().__init__()
        self.gm, self.order, self.fixed = gm, sig.activations + sig.weights, fixed

    def forward(self, *tensors):
        args = [None] * (len(tensors) + len(self.fixed))
        for i, value in self.fixed.items():
            args[i] = value
        for i, tensor in zip(self.order, tensors):
            args[i] = tensor
        return self.gm(*args)


def to_relax(gm: fx.GraphModule, sig: Signature, args, weights) -> tvm.IRModule:
    """``main(*activations, *weights)``: ``gm`` at ``args``' shapes, as Relax, on the host in
    fp32 (:func:`host_fp32`); ``weights``: :func:`host_weights` of ``args``' weights. Raises
    :class:`Unsupported` naming what could not be exported or imported."""
    fixed = {i: int(args[i]) for i in sig.sizes}
    activations = tuple(torch.empty(args[i].shape, dtype=export_dtype(args[i].dtype)) for i in sig.activations)
    try:
        with torch.no_grad():
            program = torch.export.export(_Specialized(host_fp32(gm), sig, fixed), activations + tuple(weights))
            program = views_as_reshapes(program).run_decompositions()
    except Exception as e:  # noqa: BLE001 - whatever export rejects, the graph runs eagerly
        raise Unsupported(f"torch.export failed: {first_line(e)}") from e
    mutated = {**program.graph_signature.buffers_to_mutate, **program.graph_signature.user_inputs_to_mutate}
    if mutated:
        # the importer returns the user outputs only: an in-place update of an input would be lost
        raise Unsupported(f"the graph updates its input {min(mutated.values())} in place")
    missing = unsupported_ops(program)
    if missing:
        raise Unsupported(f"TVM's importer has no conversion for {', '.join(missing)}")
    try:
        return from_exported_program(program, run_ep_decomposition=False)
    except Exception as e:  # noqa: BLE001 - a converter that rejects its arguments
        node = _failing_node(e)
        where = f" at {node.target} ({node.name})" if node is not None else ""
        raise Unsupported(f"TVM's importer failed{where}: {first_line(e)}") from e


def views_as_reshapes(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` (changed in place) with every ``aten.view`` a ``aten.reshape``: the same
    values in a graph without mutation, and one that survives decomposition. Decomposing
    ``scaled_dot_product_attention`` gives its output other strides than eager's, and export has
    dropped the ``.contiguous()`` that was a no-op in eager, so a model's later ``view`` (Hugging
    Face GPT-2's ``Conv1D`` at batch 4) raises "Cannot view a tensor with shape ... and strides
    ..." in TVM's importer; a reshape copies where a view cannot."""
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target == torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
    program.graph_module.recompile()
    return program


def host_fp32(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` that runs on the host in fp32: the devices it names are the host, its
    fp16 and bf16 dtypes fp32, its tensor constants host fp32 copies.

    On the host, because the weights' fp32 copies are there (an fp16 model's GPU does not hold
    its weights twice), so every device the graph names must be the host too (a transformer's
    ``arange(..., device=...)``). In fp32, because TVM's importer gives every matmul an fp32
    result: the bias add of an fp16 ``addmm`` then mixes fp32 and fp16 and the import fails.
    ``for_inference`` makes fp16 what should be."""
    copy = fx.GraphModule(gm, deepcopy(gm.graph))

    def retyped(value):
        if isinstance(value, torch.device):
            return torch.device("cpu")
        if isinstance(value, torch.dtype):
            return export_dtype(value)
        return value

    for i, node in enumerate(copy.graph.nodes):
        node.args = fx.node.map_aggregate(node.args, retyped)
        node.kwargs = fx.node.map_aggregate(node.kwargs, retyped)
        if node.op == "get_attr":
            value = _attr(copy, node.target)
            if isinstance(value, torch.Tensor):
                # a fresh name: the copy shares its submodules with gm, which must not change
                node.target = f"_host_constant_{i}"
                copy.register_buffer(node.target, value.detach().to("cpu", export_dtype(value.dtype)))
    copy.recompile()
    return copy


def _attr(module: torch.nn.Module, path: str):
    for name in path.split("."):
        module = getattr(module, name)
    return module


def export_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp16 and bf16 (:func:`host_fp32`); others as they are."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def host_weights(tensors) -> list[torch.Tensor]:
    """Host copies of the weights, floating ones in fp32 (:func:`host_fp32`). Copies: a
    later in-place update of the model must not reach a compiled program on one device and not
    on another."""
    return [t.detach().to("cpu", export_dtype(t.dtype), copy=True).contiguous() for t in tensors]


def output_dtypes(gm: fx.GraphModule) -> list[torch.dtype] | None:
    """The dtypes of the graph's outputs, as dynamo traced them (None where it did not record
    them): a compiled program hands its outputs back in these."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    dtypes = [getattr(v.meta.get("example_value"), "dtype", None) if isinstance(v, fx.Node) else None for v in values]
    return None if None in dtypes else dtypes


def unsupported_ops(program) -> list[str]:
    """The ATen ops of ``program`` that TVM's importer has no conversion for."""
    known = ExportedProgramImporter().convert_map
    return sorted({str(n.target) for n in program.graph.nodes
                   if n.op == "call_function" and getattr(n.target, "__name__", str(n.target)) not in known})


def _failing_node(error: BaseException) -> fx.Node | None:
    """The FX node the importer was converting when it raised: the innermost frame's ``node``."""
    found, tb = None, error.__traceback__
    while tb is not None:
        node = tb.tb_frame.f_locals.get("node")
        if isinstance(node, fx.Node):
            found = node
        tb = tb.tb_next
    return found


def first_line(error: BaseException) -> str:
    """``error`` in one line, for a warning: its type and its message's first line."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]
