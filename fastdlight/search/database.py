"""Verified tuning results kept across runs: which config won for which PrimFunc on which GPU.

    db = TuningDatabase("tuned/")            # a directory; one JSON-lines file in it
    hit = db.lookup(func, arch)              # a Record or None
    db.commit(func, arch, config, latency_ms, verified=True, reference="...")
    db.commit_key("my_gemm_1024", arch, params, func, ...)   # @autotune's winners, by a name
    db.lookup_key("my_gemm_1024", arch)                      # a KeyRecord or None

The JSON-lines file is the source of truth; a MetaSchedule JSON database beside it
(:mod:`fastdlight.search.meta_schedule_view`) mirrors the records whose schedule has a trace, for
TVM's ``ms.database.JSONDatabase`` and ``relax.transform.MetaScheduleApplyDatabase``. A record stores the winning :class:`Config` (not a
schedule trace: re-applying a config is deterministic and takes milliseconds, and it works for
the tensor-core path, whose schedule is made on a rewritten copy of the function) and the
function itself, so a hit is decided by structural equality, never by a hash alone. A wgmma
winner also stores its kernel: that template parses TVMScript, 0.1-0.3 s a function.

A record is keyed by the function's structural hash, the target (GPU name and arch), the TVM
version and a fingerprint of the template code for the config's kind: a record of another TVM,
GPU or template version is ignored (and counted), so a changed template never replays a stale
config. Only verified winners are stored. ``@fastdlight.autotune`` winners (a user's own
schedule, chosen from a user's search space) are rows of the same file keyed by the name the
user gave (``commit_key`` / ``lookup_key``): the winning parameters and the scheduled function
itself, for the target and TVM version. Appends are one ``write`` of one line under an
exclusive ``flock``, then fsynced, so concurrent tuning runs may share a directory; a torn or
garbled line is skipped with one warning naming the file and line. The newest record wins.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import threading
import time
import warnings
import zlib
from dataclasses import dataclass

import tvm
import tvm_ffi

from fastdlight.arch import CUDA
from fastdlight.config import AnyConfig, config_from_dict
from fastdlight.schedules.dispatch import template_fingerprint
from fastdlight.search.meta_schedule_view import MetaScheduleView

FILE_NAME = "fastdlight_records.jsonl"
#: keys every record has; a line without them is not a record
_REQUIRED = ("key", "arch", "target", "tvm", "template", "config", "func", "verified")
#: keys every ``@autotune`` record has (a winner stored under a user's key, not a Config)
_REQUIRED_KEYED = ("autotune", "arch", "target", "tvm", "params", "func", "verified")


@dataclass(frozen=True)
class Record:
    config: AnyConfig
    arch: str  # CUDA.name of the GPU it was tuned for
    latency_ms: float | None
    verified: bool
    reference: str | None  # what the winner was verified against
    created: float  # epoch seconds
    kernel: str | None = None  # the winner's kernel, where rebuilding it is slow (see commit)

    def load_kernel(self):
        """The stored kernel (a PrimFunc), or None when the record has none."""
        if self.kernel is None:
            return None
        return tvm.ir.load_json(zlib.decompress(base64.b64decode(self.kernel)).decode())


@dataclass(frozen=True)
class KeyRecord:
    """An ``@autotune`` winner: its parameters (JSON values), the scheduled function (TVM JSON),
    the space it was chosen from (name -> values, JSON) and what it was verified against."""

    key: str
    params: dict
    func_json: str
    space: dict | None
    arch: str
    latency_ms: float | None
    verified: bool
    reference: str | None
    created: float


@dataclass(frozen=True)
class LoadStats:
    """What the last read of the file found."""

    records: int = 0  # usable: this TVM, a known template fingerprint
    skipped_lines: int = 0  # torn, garbled or not a record
    other_version: int = 0  # another TVM version
    stale_template: int = 0  # the template code changed since
    other_target: int = 0  # (counted by lookups) the function's records for other GPUs


def func_key(func) -> str:
    return f"{tvm_ffi.structural_hash(func):x}"


def target_key(arch: CUDA) -> str:
    return f"{arch.name}/{arch.arch}"


class TuningDatabase:
    def __init__(self, path):
        self.dir = os.fspath(path)
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as e:
            raise OSError(f"cannot use {self.dir} as a tuning database: {e.strerror}") from None
        self.file = os.path.join(self.dir, FILE_NAME)
        self.meta_schedule = MetaScheduleView(self.dir)
        self._lock = threading.Lock()
        self._rows: list[dict] = []
        self._read_upto = 0  # bytes of the file already parsed
        self._line_no = 0
        self.stats = LoadStats()

    # -- reading ----------------------------------------------------------------------------
    def _refresh(self) -> list[dict]:
        """Parse what was appended since the last read (by this or any other process)."""
        if not os.path.exists(self.file):
            return self._rows
        with open(self.file, "rb") as f:
            f.seek(self._read_upto)
            tail = f.read()
        end = tail.rfind(b"\n") + 1  # a line still being written is read next time
        bad: list[int] = []
        for raw in tail[:end].splitlines():
            self._line_no += 1
            row = _parse(raw)
            if row is None:
                if raw.strip():
                    bad.append(self._line_no)
                continue
            self._count(row)
            self._rows.append(row)
        self._read_upto += end
        if bad:
            self.stats = _bump(self.stats, skipped_lines=len(bad))
            warnings.warn(f"fastdlight: {self.file}:{bad[0]}: not a tuning record, skipped"
                          + (f" (and {len(bad) - 1} more line(s))" if len(bad) > 1 else ""), stacklevel=4)
        return self._rows

    def _count(self, row: dict) -> None:
        if row["tvm"] != tvm.__version__:
            self.stats = _bump(self.stats, other_version=1)
        elif "autotune" not in row and row["template"] != template_fingerprint(row["config"].get("kind", "")):
            self.stats = _bump(self.stats, stale_template=1)
        else:
            self.stats = _bump(self.stats, records=1)

    def lookup(self, func, arch: CUDA) -> Record | None:
        """The newest verified record for a function structurally equal to ``func`` on ``arch``,
        made by this TVM version and the current template code."""
        key, target = func_key(func), target_key(arch)
        with self._lock:
            same_func = [r for r in self._refresh() if r.get("key") == key]
            rows = [r for r in same_func if r["target"] == target]
            self.stats = _bump(self.stats, other_target=len(same_func) - len(rows))
        for row in reversed(rows):
            if not _current(row):
                continue
            if tvm_ffi.structural_equal(tvm.ir.load_json(row["func"]), func):
                return Record(config_from_dict(row["config"]), row["arch"], row.get("latency_ms"), True,
                              row.get("reference"), row.get("created", 0.0), row.get("kernel"))
        return None

    def lookup_key(self, key: str, arch: CUDA) -> KeyRecord | None:
        """The newest ``@autotune`` record stored under ``key`` for ``arch`` by this TVM version."""
        target = target_key(arch)
        with self._lock:
            rows = [r for r in self._refresh() if r.get("autotune") == key]
            self.stats = _bump(self.stats, other_target=sum(r["target"] != target for r in rows))
        for row in reversed(rows):
            if row["target"] == target and _current(row):
                return KeyRecord(key, dict(row["params"]), row["func"], row.get("space"), row["arch"],
                                 row.get("latency_ms"), True, row.get("reference"), row.get("created", 0.0))
        return None

    # -- writing ----------------------------------------------------------------------------
    def commit(self, func, arch: CUDA, config: AnyConfig, latency_ms: float | None = None, verified: bool | None = None,
               reference: str | None = None, kernel=None) -> None:
        """Append a verified winner. A winner that failed or skipped verification is refused.
        ``kernel``: the scheduled function, stored (TVM JSON, compressed: ~30 KB) where
        re-applying the config is slow: a wgmma kernel is parsed from TVMScript, 0.1-0.3 s."""
        if verified is not True:
            raise ValueError(f"refusing to store {config!r}: it was not verified")
        row = {
            "key": func_key(func), "arch": arch.name, "target": target_key(arch), "tvm": tvm.__version__,
            "template": template_fingerprint(config.kind), "config": config.to_dict(), "latency_ms": latency_ms,
            "verified": True, "reference": reference, "created": time.time(), "func": tvm.ir.save_json(func),
        }  # fmt: skip
        if kernel is not None:
            row["kernel"] = base64.b64encode(zlib.compress(tvm.ir.save_json(kernel).encode())).decode()
        self._append(row)
        self.meta_schedule.add(func, arch, config, latency_ms)

    def commit_key(self, key: str, arch: CUDA, params: dict, func, latency_ms: float | None = None,
                   verified: bool | None = None, reference: str | None = None, space: dict | None = None) -> None:
        """Append a verified ``@autotune`` winner under ``key``: ``params`` and ``space`` must be
        JSON values; ``func`` is the scheduled PrimFunc that won. An unverified one is refused."""
        if verified is not True:
            raise ValueError(f"refusing to store {key!r} {params}: it was not verified")
        self._append({
            "autotune": key, "arch": arch.name, "target": target_key(arch), "tvm": tvm.__version__,
            "params": params, "space": space, "latency_ms": latency_ms, "verified": True,
            "reference": reference, "created": time.time(), "func": tvm.ir.save_json(func),
        })  # fmt: skip

    def _append(self, row: dict) -> None:
        line = (json.dumps(row) + "\n").encode()
        with self._lock:
            fd = os.open(self.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.write(fd, line)  # O_APPEND + one write: the line lands whole, after every other
                os.fsync(fd)
            finally:
                os.close(fd)  # closing releases the lock

    def __len__(self) -> int:
        """Records usable by this TVM version and template code."""
        with self._lock:
            return sum(1 for r in self._refresh() if _current(r))


def _parse(raw: bytes) -> dict | None:
    try:
        row = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if isinstance(row, dict) and "autotune" in row:
        keyed = all(k in row for k in _REQUIRED_KEYED) and row["verified"] is True
        return row if keyed and isinstance(row["params"], dict) and isinstance(row["autotune"], str) else None
    if not isinstance(row, dict) or any(k not in row for k in _REQUIRED) or row["verified"] is not True:
        return None
    try:
        config_from_dict(row["config"])
    except (TypeError, ValueError, AttributeError):
        return None
    return row


def _current(row: dict) -> bool:
    if "autotune" in row:  # a user's own schedule: no template of ours to fingerprint
        return row["tvm"] == tvm.__version__
    return row["tvm"] == tvm.__version__ and row["template"] == template_fingerprint(row["config"].get("kind", ""))


def _bump(stats: LoadStats, **counts) -> LoadStats:
    return LoadStats(**{k: getattr(stats, k) + counts.get(k, 0) for k in LoadStats.__dataclass_fields__})
