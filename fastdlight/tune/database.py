"""Tuning results kept across runs: which config won for which PrimFunc on which GPU.

    db = TuningDatabase("tuned/")            # a directory; one JSON-lines file in it
    hit = db.lookup(func, arch)              # a Record or None
    db.commit(func, arch, best)              # after apply_and_build

A record stores the winning :class:`Config` (not a schedule trace): re-applying a config is
deterministic and takes milliseconds, and it works for the tensor-core path, whose schedule is
made on a rewritten copy of the function. The function itself is stored too, so a lookup is
decided by structural equality, never by a hash alone. Records are appended (several tuning
runs may share a directory); the last record for a function and GPU wins.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass

import tvm
import tvm_ffi

from ..arch import CUDA
from ..policies.config import Config

FILE_NAME = "fastdlight_records.jsonl"


@dataclass(frozen=True)
class Record:
    config: Config
    arch: str  # CUDA.name of the GPU it was tuned for
    latency_ms: float | None  # None: chosen without a GPU (predicted cost)
    verified: bool | None
    created: float  # epoch seconds


def func_key(func) -> str:
    return f"{tvm_ffi.structural_hash(func):x}"


class TuningDatabase:
    def __init__(self, path: str):
        self.dir = os.fspath(path)
        os.makedirs(self.dir, exist_ok=True)
        self.file = os.path.join(self.dir, FILE_NAME)
        self._lock = threading.Lock()
        self._rows: list[dict] | None = None

    def _load(self) -> list[dict]:
        if self._rows is None:
            rows = []
            if os.path.exists(self.file):
                with open(self.file) as f:
                    for n, line in enumerate(f, 1):
                        if not line.strip():
                            continue
                        try:
                            rows.append(json.loads(line))
                        except json.JSONDecodeError as e:
                            raise ValueError(f"{self.file}:{n}: not a fastdlight tuning record ({e})") from None
            self._rows = rows
        return self._rows

    def lookup(self, func, arch: CUDA) -> Record | None:
        """The newest record for a function structurally equal to ``func`` on ``arch``."""
        key = func_key(func)
        with self._lock:
            rows = [r for r in self._load() if r["key"] == key and r["arch"] == arch.name]
        for row in reversed(rows):
            if tvm_ffi.structural_equal(tvm.ir.load_json(row["func"]), func):
                return Record(Config.from_dict(row["config"]), row["arch"], row.get("latency_ms"),
                              row.get("verified"), row.get("created", 0.0))
        return None

    def commit(self, func, arch: CUDA, config: Config, latency_ms: float | None = None,
               verified: bool | None = None, reference: str | None = None) -> None:
        if verified is not True:
            raise ValueError("refusing to store a winner that was not verified")
        row = {
            "key": func_key(func), "arch": arch.name, "target": str(arch.target), "config": config.to_dict(),
            "latency_ms": latency_ms, "verified": verified, "reference": reference, "created": time.time(), "func": tvm.ir.save_json(func),
        }  # fmt: skip
        with self._lock:
            self._load().append(row)
            with open(self.file, "a") as f:
                f.write(json.dumps(row) + "\n")

    def __len__(self) -> int:
        with self._lock:
            return len(self._load())
