"""Faults in a tuning database's files: nothing in them makes the database raise. Each unusable
record is skipped with one warning naming the file and line, the other records are still found,
a torn line never swallows the next commit, concurrent writers lose nothing, and a broken
MetaSchedule view never costs the record it mirrors. What cannot be opened is one error, raised
when the database is opened."""

import base64
import json
import os
import threading
import warnings
import zlib
from pathlib import Path

import pytest
import tvm

from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.search import database, meta_schedule_view, tuner
from fastdlight.search.database import DatabaseError, TuningDatabase

H100 = CUDA("nvidia/nvidia-h100")
CFG = Config("elementwise", (1, 128), (1, 1))


@pytest.fixture(scope="module")
def funcs():
    """Three different functions: one record each, the middle one the victim."""
    return [ops.elementwise((64, 64), "float16", "add").func, ops.elementwise((64, 64), "float16", "copy").func,
            ops.elementwise((64, 128), "float16", "add").func]


def fill(path, funcs, kernel: bool = False) -> TuningDatabase:
    db = TuningDatabase(path)
    for i, func in enumerate(funcs):
        db.commit(func, H100, CFG, 0.01 * (i + 1), True, reference="test", kernel=func if kernel else None)
    return db


def rows(db: TuningDatabase) -> list[dict]:
    with open(db.file) as f:
        return [json.loads(line) for line in f]


def rewrite(db: TuningDatabase, lines: list[str]) -> None:
    with open(db.file, "w") as f:
        f.write("".join(line + "\n" for line in lines))


def skipped_warnings(caught, line: int) -> list[str]:
    return [str(w.message) for w in caught if f"{database.FILE_NAME}:{line}:" in str(w.message)]


def assert_only_victim_lost(path, funcs, line: int = 2) -> None:
    """A fresh reader finds the other records, not the victim's, with one warning naming its line
    (however often it is looked up)."""
    reader = TuningDatabase(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert reader.lookup(funcs[0], H100).latency_ms == 0.01
            assert reader.lookup(funcs[1], H100) is None
            assert reader.lookup(funcs[2], H100).latency_ms == 0.03
    assert len(skipped_warnings(caught, line)) == 1, [str(w.message) for w in caught]
    assert reader.stats.skipped_lines == 1


def test_a_file_truncated_mid_line_loses_only_that_line(tmp_path, funcs):
    db = fill(tmp_path, funcs)
    size = os.path.getsize(db.file)
    with open(db.file, "r+b") as f:
        f.truncate(size - 40)  # inside the third line
    reader = TuningDatabase(tmp_path)
    with pytest.warns(UserWarning, match=rf"{database.FILE_NAME}:3: not a tuning record"):
        assert reader.lookup(funcs[2], H100) is None
    assert reader.lookup(funcs[0], H100).latency_ms == 0.01 and reader.lookup(funcs[1], H100).latency_ms == 0.02
    # the next commit starts a line of its own, which this reader and a fresh one both read
    db.commit(funcs[2], H100, CFG, 0.05, True)
    assert reader.lookup(funcs[2], H100).latency_ms == 0.05
    with pytest.warns(UserWarning, match=rf"{database.FILE_NAME}:3: not a tuning record"):
        assert TuningDatabase(tmp_path).lookup(funcs[2], H100).latency_ms == 0.05
    assert len(Path(db.file).read_text().splitlines()) == 4


def _garbled_kernel() -> str:
    return base64.b64encode(zlib.compress(b"{not tvm json")).decode()


#: (field, value) for the victim row; None for a value deletes the field
CORRUPTIONS = [
    ("key", 12345), ("key", None), ("arch", ["h100"]), ("target", 7), ("tvm", 0.27), ("template", {}),
    ("config", "garbage"), ("config", [1, 2]), ("config", {"kind": "elementwise", "block": "ab"}),
    ("config", {"kind": ["elementwise"]}), ("config", {"kind": "no_such_kind", "block": [1], "thread": [1]}),
    ("config", dict(CFG.to_dict(), pipeline_stages="4")), ("config", dict(CFG.to_dict(), use_async_copy="yes")),
    ("config", dict(CFG.to_dict(), rasterization=1.5)), ("config", dict(CFG.to_dict(), surprise=1)),
    ("func", 5), ("func", None), ("func", "{}"), ("func", "garbage"), ("func", "TRUNCATE"),
    ("func", "INT_IMM"), ("verified", "yes"), ("verified", False), ("verified", None), ("latency_ms", "fast"),
    ("latency_ms", True), ("latency_ms", [1.0]), ("reference", 3), ("created", "yesterday"), ("kernel", 5),
    ("kernel", "not base64!"), ("kernel", "GARBLED"), ("kernel", "TRUNCATE"),
]  # fmt: skip


@pytest.mark.parametrize("field,value", CORRUPTIONS, ids=[f"{f}={str(v)[:20]}" for f, v in CORRUPTIONS])
def test_each_corrupted_field_skips_its_record_with_one_warning(tmp_path, funcs, field, value):
    db = fill(tmp_path, funcs, kernel=True)
    lines = [json.dumps(r) for r in rows(db)]
    victim = json.loads(lines[1])
    if value is None:
        del victim[field]
    elif value == "TRUNCATE":  # valid JSON, but the TVM JSON (or base64 text) in it cut short
        victim[field] = victim[field][: len(victim[field]) // 2]
    elif value == "INT_IMM":  # TVM JSON of something that is not a function
        victim[field] = tvm.ir.save_json(tvm.tirx.const(1, "int32"))
    elif value == "GARBLED":
        victim[field] = _garbled_kernel()
    else:
        victim[field] = value
    lines[1] = json.dumps(victim)
    rewrite(db, lines)
    assert_only_victim_lost(tmp_path, funcs)


@pytest.mark.parametrize("line", [b"garbage", b"[1, 2]", b'"text"', b"null", b"{}", b"[" * 100_000,
                                  b"\xff\xfe{}", b'{"autotune": 5}'],
                         ids=["text", "list", "string", "null", "empty", "deep", "not-utf8", "keyed-bad-type"])
def test_a_line_that_is_no_record_is_skipped(tmp_path, funcs, line):
    db = fill(tmp_path, funcs)
    raw = Path(db.file).read_bytes().splitlines()
    raw[1] = line
    with open(db.file, "wb") as f:
        f.write(b"\n".join(raw) + b"\n")
    assert_only_victim_lost(tmp_path, funcs)


def test_an_older_record_stands_in_for_a_newer_one_that_does_not_decode(tmp_path, funcs):
    db = fill(tmp_path, funcs[:1])
    db.commit(funcs[0], H100, Config("elementwise", (1, 256), (1, 1)), 0.02, True)
    lines = Path(db.file).read_text().splitlines()
    newest = json.loads(lines[1])
    newest["func"] = newest["func"][:100]
    rewrite(db, [lines[0], json.dumps(newest)])
    reader = TuningDatabase(tmp_path)
    with pytest.warns(UserWarning, match=rf"{database.FILE_NAME}:2: its function does not decode"):
        hit = reader.lookup(funcs[0], H100)
    assert hit.config == CFG and hit.latency_ms == 0.01


def test_an_autotune_record_whose_function_does_not_decode_is_skipped(tmp_path, funcs):
    db = TuningDatabase(tmp_path)
    db.commit_key("gemm", H100, {"bm": 64}, funcs[0], 0.01, True)
    db.commit_key("gemm", H100, {"bm": 128}, funcs[0], 0.02, True)
    lines = Path(db.file).read_text().splitlines()
    newest = json.loads(lines[1])
    newest["func"] = newest["func"][:50]
    rewrite(db, [lines[0], json.dumps(newest)])
    reader = TuningDatabase(tmp_path)
    with pytest.warns(UserWarning, match=rf"{database.FILE_NAME}:2: its function does not decode"):
        assert reader.lookup_key("gemm", H100).params == {"bm": 64}


def test_a_writer_killed_mid_line_does_not_swallow_the_next_commit(tmp_path, funcs):
    db = fill(tmp_path, funcs[:1])
    reader = TuningDatabase(tmp_path)
    assert reader.lookup(funcs[0], H100) is not None  # read before the torn line
    whole = json.dumps(rows(db)[0])
    with open(db.file, "a") as f:
        f.write(whole[: len(whole) // 2])  # the writer died here: no newline
    with pytest.warns(UserWarning, match=rf"{database.FILE_NAME}:2: not a tuning record"):
        assert reader.lookup(funcs[1], H100) is None
    db.commit(funcs[1], H100, CFG, 0.02, True)
    with open(db.file, "a") as f:
        f.write("garbage\n")
    # the row after the torn line is line 3, and the reader still counts lines as the file does
    with pytest.warns(UserWarning, match=rf"{database.FILE_NAME}:4: not a tuning record"):
        assert reader.lookup(funcs[1], H100).latency_ms == 0.02
    lines = Path(db.file).read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[2])["latency_ms"] == 0.02
    fresh = TuningDatabase(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fresh.lookup(funcs[1], H100).latency_ms == 0.02 and fresh.lookup(funcs[0], H100) is not None
    assert fresh.stats.skipped_lines == 2 and len(caught) == 1


def test_writer_threads_at_once_lose_nothing_and_a_reader_meanwhile_sees_no_torn_line(tmp_path, funcs):
    n, shared = 40, TuningDatabase(tmp_path)
    reader, stop, seen = TuningDatabase(tmp_path), threading.Event(), []

    def write(db, base):
        for i in range(n):
            db.commit(funcs[i % 3], H100, CFG, float(base + i), True)

    def read():
        while not stop.is_set():
            seen.append(len(reader))

    writers = [threading.Thread(target=write, args=(db, 1000 * k))
               for k, db in enumerate([shared, shared, TuningDatabase(tmp_path), TuningDatabase(tmp_path)])]
    watcher = threading.Thread(target=read)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn or garbled line would warn
        watcher.start()
        for t in writers:
            t.start()
        for t in writers:
            t.join()
        stop.set()
        watcher.join()
        assert len(reader) == 4 * n and len(TuningDatabase(tmp_path)) == 4 * n
    latencies = sorted(r["latency_ms"] for r in rows(shared))
    assert latencies == sorted(float(1000 * k + i) for k in range(4) for i in range(n))
    assert seen == sorted(seen)  # rows only ever appear


@pytest.mark.parametrize("name", [meta_schedule_view.WORKLOAD_FILE, meta_schedule_view.RECORD_FILE])
@pytest.mark.parametrize("fault", ["garbage", "directory"])
def test_a_broken_metaschedule_view_warns_and_the_record_stands(tmp_path, funcs, name, fault):
    path = tmp_path / name
    if fault == "garbage":
        path.write_text('{"not": json at all\n')
    else:
        path.mkdir()
    db = TuningDatabase(tmp_path)
    with pytest.warns(UserWarning, match="MetaSchedule database .* was not updated"):
        db.commit(funcs[0], H100, CFG, 0.01, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per view, not per commit
        db.commit(funcs[1], H100, CFG, 0.02, True)
        hit = TuningDatabase(tmp_path).lookup(funcs[0], H100)
    assert hit.config == CFG and hit.latency_ms == 0.01


@pytest.mark.parametrize("name", [meta_schedule_view.WORKLOAD_FILE, meta_schedule_view.RECORD_FILE])
def test_an_unreadable_metaschedule_database_offers_no_candidates_with_a_warning(tmp_path, funcs, name):
    for other in (meta_schedule_view.WORKLOAD_FILE, meta_schedule_view.RECORD_FILE):
        (tmp_path / other).write_text('{"not": json at all\n' if other == name else "")
    with pytest.warns(UserWarning, match="MetaSchedule database .* was not read"):
        assert TuningDatabase(tmp_path).meta_schedule.records(funcs[0]) == ()


def test_a_directory_in_place_of_the_records_file_is_one_error_at_open(tmp_path, funcs, monkeypatch):
    (tmp_path / database.FILE_NAME).mkdir()
    with pytest.raises(DatabaseError, match=f"{database.FILE_NAME} as the tuning database's records: it is not a file"):
        TuningDatabase(tmp_path)
    monkeypatch.setattr(tuner, "tune_function", lambda *a, **k: pytest.fail("tuned before opening the database"))
    with pytest.raises(ValueError, match="it is not a file") as err:
        tuner.tune(funcs[0], H100, database=tmp_path)
    assert isinstance(err.value, OSError) and "\n" not in str(err.value)


def test_a_file_in_place_of_the_directory_is_one_error_at_open(tmp_path, funcs, monkeypatch):
    blocker = tmp_path / "tuned"
    blocker.write_text("x")
    with pytest.raises(DatabaseError, match=f"cannot use {blocker} as a tuning database: it is a file"):
        TuningDatabase(blocker)
    monkeypatch.setattr(tuner, "tune_function", lambda *a, **k: pytest.fail("tuned before opening the database"))
    with pytest.raises(ValueError, match="it is a file, not a directory"):
        tuner.tune(funcs[0], H100, database=str(blocker))
