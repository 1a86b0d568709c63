"""``torch.compile(model, backend="fastdlight")``: a PyTorch model's graphs compiled through TVM,
their GPU kernels tuned by fastdlight.

    import torch

    model = model.half().cuda().eval()
    fast = torch.compile(model, backend="fastdlight")
    with torch.no_grad():
        y = fast(x)                 # the first call exports, tunes and builds; later ones run it

    fast = torch.compile(model, backend="fastdlight",
                         options={"topk": 10, "fp16": True, "database": "tuned/"})

The name resolves through the ``torch_dynamo_backends`` entry point of the installed package
(``pip install fastdlight[torch]``); from a source tree that is not installed, call
:func:`register` first or pass ``backend=fastdlight.torch_backend.backend``.

What happens to each graph dynamo hands over (:mod:`.dynamo`):

- It is specialized to the call's shapes, exported with ``torch.export`` on the host in fp32
  and imported with TVM's exported-program importer (:mod:`.graph`). Parameters and buffers
  become constants: they are read when the graph compiles, so after changing a model's weights
  in place, call ``torch._dynamo.reset()``.
- ``for_inference`` then computes in fp16 with fp32 accumulation where the graph has fp16
  tensors (a ``.half()`` model takes and returns fp16, as in eager), or everywhere with
  ``options={"fp16": True}``; an fp32 model stays fp32; a bf16 one runs in fp32, its inputs and
  outputs cast at the edges.
- On a CUDA device, ``compile_model`` (``prepare``, ``ApplyFastTuning``, ``build``) tunes every
  kernel; the winners are kept in a database under the user's cache directory
  (:func:`cache_dir`; ``FASTDLIGHT_CACHE`` moves it). On the CPU it is built with TVM's default
  pipeline for the host: it runs, untuned.
- The built program is kept there too (:mod:`.programs`), under a key of the graph, its shapes,
  its weights' content, the target and the versions: another process (or this one after
  ``torch._dynamo.reset()``) loads it without exporting, tuning or building.
  ``options={"database": False}`` keeps neither.
- Calls pass torch tensors to TVM through DLPack, without copies, and the kernels run on
  torch's current CUDA stream. On a GPU a call replays the program from a CUDA graph
  (``options={"cuda_graph": False}``: launch by launch; :mod:`.runtime`).
- A new input shape compiles again (dynamo's guards for a static graph; one program per shape
  for a graph dynamo traced with symbolic sizes).
- Compiled graphs run forward only: under autograd (grad mode on, a parameter that requires
  grad) the graph runs eagerly. So does a graph with an op TVM cannot import, one that updates
  its inputs in place, one whose build fails, or one on a device TVM cannot use: each with one
  :class:`EagerFallbackWarning` naming the op or the reason (``options={"fallback": False}``
  raises instead).

``import fastdlight.torch_backend`` imports neither torch nor TVM; the names below load on
first use.
"""

import importlib

from fastdlight.torch_backend.cache import CACHE_ENV, cache_dir, database_dir

_LAZY = {
    "backend": "fastdlight.torch_backend.dynamo",
    "EagerFallbackWarning": "fastdlight.torch_backend.dynamo",
    "NAME": "fastdlight.torch_backend.dynamo",
    "Settings": "fastdlight.torch_backend.runtime",
}

__all__ = ["CACHE_ENV", "NAME", "EagerFallbackWarning", "Settings", "backend", "cache_dir", "database_dir", "register"]


def register() -> None:
    """Make ``backend="fastdlight"`` known to torch without the installed entry point (a
    source tree on ``PYTHONPATH``). Does nothing where the name is already known."""
    from torch._dynamo import list_backends, register_backend

    from fastdlight.torch_backend.dynamo import NAME, backend

    if NAME not in list_backends(exclude_tags=()):
        register_backend(compiler_fn=backend, name=NAME)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'fastdlight.torch_backend' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
