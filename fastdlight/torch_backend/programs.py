"""Compiled programs kept in the cache directory, so that another process runs a graph it has
compiled before without exporting, tuning or building it again.

The tuning database alone leaves a second process its export, import, ``prepare`` and build:
ResNet-18 took 33 s to its first result that way (H200). A program is found by a key made
before the graph is exported (:func:`program_key`): the graph's code, the activations' shapes
and dtypes, the sizes' values, the content of every weight (the program holds them as
constants), the target, the settings that change what is built, and the versions of
fastdlight, TVM and torch. An entry is the built library and the dtypes its entry takes,
written to a temporary directory and renamed into place, so a reader finds a whole entry or
none; one that cannot be loaded is a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import tvm
from torch import fx
from tvm import relax

from fastdlight import __version__
from fastdlight.torch_backend.cache import cache_dir
from fastdlight.torch_backend.graph import Signature

log = logging.getLogger("fastdlight.torch_backend")

#: bumped when an entry's layout or the key's recipe changes
FORMAT = 1
LIBRARY, META = "program.so", "program.json"


def programs_dir() -> Path:
    """``cache_dir() / "programs"``."""
    return cache_dir() / "programs"


@dataclass(frozen=True)
class StoredProgram:
    """A cache entry as loaded: the VM's entry function and the dtypes it takes."""

    main: object
    in_dtypes: tuple[torch.dtype, ...]


def program_key(gm: fx.GraphModule, sig: Signature, args, target: str, build_settings: dict) -> str:
    """The hex digest that names ``gm``'s program at ``args`` for ``target``. ``build_settings``:
    what else changes the program (fp16, the tuning options), JSON-able."""
    h = hashlib.blake2b(digest_size=20)

    def add(value) -> None:
        h.update(repr(value).encode())
        h.update(b"\0")

    add((FORMAT, __version__, tvm.__version__, torch.__version__, target))
    add(json.dumps(build_settings, sort_keys=True, default=str))
    add(gm.code)
    add((sig.weights, sig.activations, sig.sizes))
    add([(tuple(args[i].shape), str(args[i].dtype)) for i in sig.activations])
    add([int(args[i]) for i in sig.sizes])
    tensors = [args[i] for i in sig.weights] + [t for _, t in sorted(gm.state_dict().items())]
    add([(tuple(t.shape), str(t.dtype)) for t in tensors])
    for digest in _digests(tensors):
        h.update(digest)
    return h.hexdigest()


def _digests(tensors) -> list[bytes]:
    """Each tensor's content digest; hashlib releases the GIL, so large tensors hash in parallel."""

    def digest(t: torch.Tensor) -> bytes:
        data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        return hashlib.blake2b(memoryview(data), digest_size=20).digest()

    if len(tensors) < 2:
        return [digest(t) for t in tensors]
    with ThreadPoolExecutor(max_workers=min(len(tensors), os.cpu_count() or 1)) as pool:
        return list(pool.map(digest, tensors))


def load(key: str, dev) -> StoredProgram | None:
    """The program stored under ``key``, on TVM device ``dev``; None when there is none or it
    cannot be loaded (then it is rebuilt and stored again)."""
    entry = programs_dir() / key
    if not (entry / META).is_file():
        return None
    try:
        meta = json.loads((entry / META).read_text())
        library = tvm.runtime.load_module(str(entry / LIBRARY))
        main = relax.VirtualMachine(library, dev)["main"]
        in_dtypes = tuple(getattr(torch, name) for name in meta["in_dtypes"])
    except Exception as e:  # noqa: BLE001 - a damaged or foreign entry is a miss
        log.info("fastdlight: the stored program %s could not be loaded (%s); building it again", key, e)
        return None
    return StoredProgram(main, in_dtypes)


def store(key: str, executable, in_dtypes) -> Path | None:
    """Write ``executable`` (a Relax VM executable) under ``key``; None, with a log line, when it
    could not be (a read-only cache, no host compiler to link the library): the program runs
    all the same."""
    root = programs_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    except OSError as e:
        log.info("fastdlight: programs are not kept (%s)", e)
        return None
    try:
        executable.export_library(str(tmp / LIBRARY))
        (tmp / META).write_text(json.dumps({"in_dtypes": [str(d).removeprefix("torch.") for d in in_dtypes]}))
        os.replace(tmp, root / key)
    except Exception as e:  # noqa: BLE001 - another process stored it first, or export failed
        shutil.rmtree(tmp, ignore_errors=True)
        if (root / key / META).is_file():
            return root / key
        log.info("fastdlight: the program was not kept (%s)", e)
        return None
    return root / key
