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
function itself, so a hit is decided by structural equality, never by a hash alone. A winner
also stores its kernel (the scheduled function), which a replay loads instead of scheduling the
function again: a wgmma kernel is parsed from TVMScript (0.1-0.3 s), a tensor-core schedule
first imports TVM's tensor intrinsics.

A record is keyed by the function's structural hash, the target (GPU name and arch), the TVM
version and a fingerprint of the template code for the config's kind: a record of another TVM,
GPU or template version is ignored (and counted), so a changed template never replays a stale
config. Only verified winners are stored. ``@fastdlight.autotune`` winners (a user's own
schedule, chosen from a user's search space) are rows of the same file keyed by the name the
user gave (``commit_key`` / ``lookup_key``): the winning parameters and the scheduled function
itself, for the target and TVM version. Appends are one ``write`` of one line under an
exclusive ``flock``, then fsynced, so concurrent tuning runs may share a directory; an append
after a torn line (a writer killed mid-line) starts a line of its own. The newest record wins.

Nothing in the files makes the database raise: a line that is not a record (torn, not JSON, a
field missing or of the wrong type, a config that does not load, a function or kernel that does
not decode) is skipped with one warning naming the file and line, and older records are used.
Only what cannot be opened raises, when the database is opened, before any tuning: a file where
the directory should be, a directory where the records file should be (:class:`DatabaseError`).
The MetaSchedule view is written after the record and its failures are warnings.
"""

from __future__ import annotations

import base64
import dataclasses
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
from fastdlight.compiler.workers import one_line
from fastdlight.config import AnyConfig, config_from_dict
from fastdlight.schedules.dispatch import template_fingerprint
from fastdlight.search.meta_schedule_view import MetaScheduleView

FILE_NAME = "fastdlight_records.jsonl"
#: keys every record has; a line without them is not a record
_REQUIRED = ("key", "arch", "target", "tvm", "template", "config", "func", "verified")
#: keys every ``@autotune`` record has (a winner stored under a user's key, not a Config)
_REQUIRED_KEYED = ("autotune", "arch", "target", "tvm", "params", "func", "verified")
_NUMBER, _NONE = (int, float), type(None)
#: the JSON types of a row's fields (where present); a field of another type makes the line no record
_FIELD_TYPES = {
    "key": str, "autotune": str, "arch": str, "target": str, "tvm": str, "template": str, "config": dict,
    "params": dict, "space": (dict, _NONE), "func": str, "kernel": (str, _NONE), "verified": bool,
    "latency_ms": (*_NUMBER, _NONE), "reference": (str, _NONE), "created": _NUMBER,
}  # fmt: skip
#: warnings naming skipped lines list at most this many line numbers
_LINES_NAMED = 10


class DatabaseError(OSError, ValueError):
    """A tuning database that cannot be used: its directory is a file, its records file a
    directory, or neither can be made or read. Raised when the database is opened."""


@dataclass(frozen=True)
class Record:
    config: AnyConfig
    arch: str  # CUDA.name of the GPU it was tuned for
    latency_ms: float | None
    verified: bool
    reference: str | None  # what the winner was verified against
    created: float  # epoch seconds
    kernel: str | None = None  # the winner's kernel (see commit); None in records written before
    #: the kernel, already decoded by the lookup that checked it
    _kernel_func: object = dataclasses.field(default=None, repr=False, compare=False)

    def load_kernel(self):
        """The stored kernel (a PrimFunc), or None when the record has none."""
        if self._kernel_func is not None or self.kernel is None:
            return self._kernel_func
        return _decode_kernel(self.kernel)


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
    #: ``func_json`` decoded, by the lookup that checked it
    func: object = dataclasses.field(default=None, repr=False, compare=False)


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
        if os.path.exists(self.dir) and not os.path.isdir(self.dir):
            raise DatabaseError(f"cannot use {self.dir} as a tuning database: it is a file, not a directory")
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as e:
            raise DatabaseError(f"cannot use {self.dir} as a tuning database: {e.strerror}") from None
        self.file = os.path.join(self.dir, FILE_NAME)
        _check_records_file(self.file)
        self.meta_schedule = MetaScheduleView(self.dir)
        self._lock = threading.Lock()
        self._rows: list[tuple[int, dict]] = []  # (line number, row)
        self._read_upto = 0  # bytes of the file already parsed
        self._line_no = 0
        self.stats = LoadStats()

    # -- reading ----------------------------------------------------------------------------
    def _refresh(self) -> list[tuple[int, dict]]:
        """Parse what was appended since the last read (by this or any other process)."""
        tail = self._read_tail()
        bad: list[int] = []
        for raw in tail.split(b"\n")[:-1] if tail else ():
            self._line_no += 1
            row = _parse(raw)
            if row is None:
                if raw.strip():
                    bad.append(self._line_no)
                continue
            self._count(row)
            self._rows.append((self._line_no, row))
        self._read_upto += len(tail)
        if bad:
            self.stats = _bump(self.stats, skipped_lines=len(bad))
            more = f" (and {len(bad) - 1} more line(s): {_line_list(bad[1:])})" if len(bad) > 1 else ""
            warnings.warn(f"fastdlight: {self.file}:{bad[0]}: not a tuning record, skipped{more}", stacklevel=4)
        return self._rows

    def _read_tail(self) -> bytes:
        """The complete lines appended since the last read; a torn last line (a writer killed
        mid-line) ends with a newline here, so it is read and skipped, not waited for."""
        try:
            fd = os.open(self.file, os.O_RDONLY)
        except FileNotFoundError:
            return b""
        except OSError as e:
            raise DatabaseError(f"cannot read the tuning database {self.file}: {e.strerror}") from None
        try:
            # writers hold the exclusive lock for their one write: under the shared one, a line
            # without its newline is torn for good, not still being written
            fcntl.flock(fd, fcntl.LOCK_SH)
            size = os.fstat(fd).st_size
            tail = os.pread(fd, max(0, size - self._read_upto), self._read_upto)
        finally:
            os.close(fd)
        # the next append starts with the newline the torn line lacks (see _append): counting
        # that byte as read now keeps this reader's line numbers those of the file
        return tail + b"\n" if tail and not tail.endswith(b"\n") else tail

    def _count(self, row: dict) -> None:
        if row["tvm"] != tvm.__version__:
            self.stats = _bump(self.stats, other_version=1)
        elif "autotune" not in row and row["template"] != template_fingerprint(row["config"].get("kind", "")):
            self.stats = _bump(self.stats, stale_template=1)
        else:
            self.stats = _bump(self.stats, records=1)

    def _drop(self, line: int, row: dict, why: str) -> None:
        """Skip a record that parsed but does not decode, with one warning naming its line."""
        with self._lock:
            self._rows = [(n, r) for n, r in self._rows if r is not row]
            self.stats = _bump(self.stats, records=-1, skipped_lines=1)
        warnings.warn(f"fastdlight: {self.file}:{line}: {why}, skipped", stacklevel=4)

    def lookup(self, func, arch: CUDA) -> Record | None:
        """The newest verified record for a function structurally equal to ``func`` on ``arch``,
        made by this TVM version and the current template code."""
        key, target = func_key(func), target_key(arch)
        with self._lock:
            same_func = [(n, r) for n, r in self._refresh() if r.get("key") == key]
            rows = [(n, r) for n, r in same_func if r["target"] == target]
            self.stats = _bump(self.stats, other_target=len(same_func) - len(rows))
        for line, row in reversed(rows):
            if not _current(row):
                continue
            try:
                stored = _decode_func(row["func"])
            except Exception as e:  # noqa: BLE001 - TVM's JSON reader raises several types on garbage
                self._drop(line, row, f"its function does not decode ({one_line(e)})")
                continue
            if not tvm_ffi.structural_equal(stored, func):
                continue
            try:
                kernel = _decode_kernel(row["kernel"]) if row.get("kernel") is not None else None
            except Exception as e:  # noqa: BLE001 - base64, zlib and TVM's reader each have their own
                self._drop(line, row, f"its kernel does not decode ({one_line(e)})")
                continue
            return Record(config_from_dict(row["config"]), row["arch"], row.get("latency_ms"), True,
                          row.get("reference"), row.get("created", 0.0), row.get("kernel"), kernel)
        return None

    def lookup_key(self, key: str, arch: CUDA) -> KeyRecord | None:
        """The newest ``@autotune`` record stored under ``key`` for ``arch`` by this TVM version."""
        target = target_key(arch)
        with self._lock:
            rows = [(n, r) for n, r in self._refresh() if r.get("autotune") == key]
            self.stats = _bump(self.stats, other_target=sum(r["target"] != target for _, r in rows))
        for line, row in reversed(rows):
            if row["target"] != target or not _current(row):
                continue
            try:
                func = _decode_func(row["func"])
            except Exception as e:  # noqa: BLE001 - TVM's JSON reader raises several types on garbage
                self._drop(line, row, f"its function does not decode ({one_line(e)})")
                continue
            return KeyRecord(key, dict(row["params"]), row["func"], row.get("space"), row["arch"],
                             row.get("latency_ms"), True, row.get("reference"), row.get("created", 0.0), func)
        return None

    # -- writing ----------------------------------------------------------------------------
    def commit(self, func, arch: CUDA, config: AnyConfig, latency_ms: float | None = None, verified: bool | None = None,
               reference: str | None = None, kernel=None) -> None:
        """Append a verified winner. A winner that failed or skipped verification is refused.
        ``kernel``: the scheduled function, stored (TVM JSON, compressed: 1-50 KB), which a
        replay loads instead of applying the config again.
        The record is stored first; the MetaSchedule view after it only warns when it fails."""
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
            try:
                fd = os.open(self.file, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as e:
                raise DatabaseError(f"cannot write the tuning database {self.file}: {e.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                end = os.fstat(fd).st_size
                if end and os.pread(fd, 1, end - 1) != b"\n":
                    line = b"\n" + line  # a writer killed mid-line: this row must not continue its line
                os.write(fd, line)  # O_APPEND + one write: the line lands whole, after every other
                os.fsync(fd)
            finally:
                os.close(fd)  # closing releases the lock

    def __len__(self) -> int:
        """Records usable by this TVM version and template code."""
        with self._lock:
            return sum(1 for _, r in self._refresh() if _current(r))


def _check_records_file(path: str) -> None:
    """A records file that exists must be a readable file: found now, not after tuning."""
    if not os.path.exists(path):
        return
    if not os.path.isfile(path):
        raise DatabaseError(f"cannot use {path} as the tuning database's records: it is not a file")
    if not os.access(path, os.R_OK):
        raise DatabaseError(f"cannot use {path} as the tuning database's records: it is not readable")


def _parse(raw: bytes) -> dict | None:
    """The row a line holds, or None when it is not a record."""
    try:
        row = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested beyond the parser
        return None
    if not isinstance(row, dict) or not _typed(row):
        return None
    if "autotune" in row:
        return row if all(k in row for k in _REQUIRED_KEYED) and row["verified"] is True else None
    if any(k not in row for k in _REQUIRED) or row["verified"] is not True:
        return None
    try:
        config = config_from_dict(row["config"])
    except (TypeError, ValueError, AttributeError, KeyError):
        return None
    return row if _config_typed(config) else None


def _typed(row: dict) -> bool:
    """Whether each field the row has is of its JSON type (a number is never a bool)."""
    for name, types in _FIELD_TYPES.items():
        if name in row:
            value = row[name]
            if not isinstance(value, types) or (isinstance(value, bool) and types is not bool):
                return False
    return True


def _config_typed(config) -> bool:
    """Whether the config's scalar fields have their defaults' types: ``Config`` converts its
    tiles but takes ``pipeline_stages="4"`` or ``use_async_copy="yes"`` as given."""
    for f in dataclasses.fields(config):
        default, value = f.default, getattr(config, f.name)
        if isinstance(default, float):
            ok = isinstance(value, _NUMBER) and not isinstance(value, bool)
        elif isinstance(default, (bool, int, str)):
            ok = type(value) is type(default)  # an int field never takes a bool, nor a bool an int
        else:
            continue
        if not ok:
            return False
    return True


def _decode_func(text: str):
    func = tvm.ir.load_json(text)
    if not isinstance(func, tvm.tirx.PrimFunc):
        raise TypeError(f"a {type(func).__name__}, not a PrimFunc")
    return func


def _decode_kernel(text: str):
    return _decode_func(zlib.decompress(base64.b64decode(text, validate=True)).decode())


def _line_list(lines: list[int]) -> str:
    named = ", ".join(str(n) for n in lines[:_LINES_NAMED])
    return named + (", ..." if len(lines) > _LINES_NAMED else "")


def _current(row: dict) -> bool:
    if "autotune" in row:  # a user's own schedule: no template of ours to fingerprint
        return row["tvm"] == tvm.__version__
    return row["tvm"] == tvm.__version__ and row["template"] == template_fingerprint(row["config"].get("kind", ""))


def _bump(stats: LoadStats, **counts) -> LoadStats:
    return LoadStats(**{k: getattr(stats, k) + counts.get(k, 0) for k in LoadStats.__dataclass_fields__})
