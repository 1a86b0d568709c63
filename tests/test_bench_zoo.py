"""benchmarks/bench_zoo.py and zoo_case.py: --list without torch or TVM, the CPU dry run of one small model, and
the one-line exit of the full run where there is no GPU."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from fastdlight.arch import has_gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_zoo.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_setup
import bench_zoo
import zoo_case
import zoo_models
import zoo_rows


def fake_child(tmp_path, monkeypatch, name: str, script: str) -> None:
    """A stand-in for the case process: ``script`` runs as ``bench_zoo``'s child."""
    fake = tmp_path / name
    fake.write_text(script)
    monkeypatch.setattr(bench_zoo, "CHILD_SCRIPT", str(fake))


def fake_done_child(tmp_path, monkeypatch, body: str, errors: str = "{}") -> None:
    """A case process that runs ``body`` (with ``json``, ``os``, ``sys``, ``time`` and the case's
    model as ``name``), then saves its row as finished, with the dict expression ``errors``."""
    fake_child(tmp_path, monkeypatch, "child.py",
        "import json, os, sys, time\n"
        "name = sys.argv[sys.argv.index('--child') + 1].split(':')[0]\n"
        + body +
        f"json.dump({{'model': name, 'family': 'x', 'size': '1', 'stage': 'done', 'errors': {errors}}},\n"
        "          open(sys.argv[sys.argv.index('--row-file') + 1], 'w'))\n")


def test_list_prints_every_model_with_its_family_and_sizes_quickly():
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, SCRIPT, "--list"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert time.perf_counter() - t0 < 10  # no torch, no TVM
    out = done.stdout
    assert "| resnet50 | torchvision | 1, 16 |" in out
    assert "| timm_resnet18 | timm | 1, 16 |" in out
    assert "| llama_gqa_2l | transformers | 1x512, 4x2048 |" in out
    assert all(f"| {name} |" in out for name in zoo_models.MODELS)


def test_list_imports_neither_torch_nor_tvm():
    code = (f"import sys; sys.argv = [{SCRIPT!r}, '--list']; import runpy\n"
            f"try:\n    runpy.run_path({SCRIPT!r}, run_name='__main__')\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "assert 'torch' not in sys.modules and 'tvm' not in sys.modules, "
            "[m for m in ('torch', 'tvm') if m in sys.modules]\nprint('clean')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr


def test_sizes_pick_each_models_quick_all_or_named_sizes():
    resnet, llama = zoo_models.MODELS["resnet50"], zoo_models.MODELS["llama_gqa_2l"]
    assert bench_zoo.sizes_of(resnet, "quick") == ["1"] and bench_zoo.sizes_of(llama, "quick") == ["1x512"]
    assert bench_zoo.sizes_of(resnet, "all") == ["1", "16"]
    assert bench_zoo.sizes_of(resnet, "16,4x2048") == ["16"] and bench_zoo.sizes_of(llama, "16,4x2048") == ["4x2048"]
    assert resnet.inputs_at("16") == (((16, 3, 224, 224), "float32"),)
    assert llama.inputs_at("4x2048") == (((4, 2048), "int64"),)
    assert llama.inputs_at(None) == llama.inputs


def test_an_error_is_told_in_one_line_that_says_what_went_wrong():
    torch_style = ValueError("Cannot view a tensor with shape [4, 2048, 768] as (8192, 768)!\n\nWhile executing %view\n"
                             "Original traceback:\n  File \"x.py\", line 9\nUse tlparse to see full graph.")
    assert bench_setup.one_line(torch_style) == "ValueError: Cannot view a tensor with shape [4, 2048, 768] as (8192, 768)!"
    tvm_style = RuntimeError("Traceback (most recent call last):\n  File \"a.cc\", line 3\nInternalError: Check failed")
    assert bench_setup.one_line(tvm_style) == "RuntimeError: InternalError: Check failed"


def test_the_table_shows_ratios_tuning_and_winners_and_a_failed_import_its_reason():
    done = bench_zoo.Row("resnet50", "torchvision", "1", stage="done", imported=True, functions=40, max_rel_err=2e-3,
                         torch_eager_ms=3.0, torch_graph_ms=1.2, torch_compile_ms=1.0, stock_ms=0.9, fastdlight_ms=0.8,
                         tune_s=61.5,
                         tune_db_s=4.2, db_hits=38, untuned=["f"], winners={"fastdlight": 30, "stock": 8, "view": 1})
    failed = bench_zoo.Row("gpt2_2l", "transformers", "4x2048", stage="import", reason="import: ValueError: no view")
    text = bench_zoo.markdown([done, failed])
    assert "| resnet50 | 1 | yes | 2.0e-03 | 3.000 | 1.200 | 1.000 | 0.900 | 0.800 | 3.75x | 1.50x | 1.25x | 1.12x | 61.5 " in text
    assert "| 4.2 (38) | 1/40 | 30/8 |" in text
    assert "| gpt2_2l | 4x2048 | no |" in text and "import: ValueError: no view |" in text
    assert "1 of 2 cases ran end to end; geomean vs torch eager 3.75x (1)" in text
    assert "geomean vs torch.compile 1.25x (1)" in text and "tuned over 60 s cold: 62 s resnet50" in text
    assert bench_zoo.row_from(json.loads(json.dumps(bench_zoo.asdict(done)))) == done


def test_the_geomean_takes_only_cases_with_both_times():
    rows = [bench_zoo.Row("a", "f", "1", stage="done", torch_compile_ms=2.0, fastdlight_ms=1.0),
            bench_zoo.Row("b", "f", "1", stage="done", torch_compile_ms=1.0, fastdlight_ms=2.0),
            bench_zoo.Row("c", "f", "1", stage="done", fastdlight_ms=2.0)]
    assert "3 of 3 cases ran end to end; geomean vs torch.compile 1.00x (2)." == zoo_rows.summary(rows)


def test_an_unknown_model_is_refused_in_one_line(capsys):
    assert bench_zoo.main(["--models", "resnet51"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown model(s) ['resnet51']")


def test_without_a_gpu_the_full_run_says_so_in_one_line_and_exits_2():
    if has_gpu():
        pytest.skip("a GPU is here: the full run would run")
    done = subprocess.run([sys.executable, SCRIPT, "--models", "timm_resnet18"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: bench_zoo needs") and "GPU" in err[0], done.stderr


def test_the_dry_run_imports_and_prepares_a_small_model_on_the_cpu(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("timm")
    monkeypatch.setenv("OUT", str(tmp_path))
    assert bench_zoo.main(["--dry-run", "--models", "timm_resnet18", "--sizes", "1"]) == 0
    data = json.loads((tmp_path / "bench_zoo_dry.json").read_text())
    (row,) = data["rows"]
    assert data["dry_run"] and row["model"] == "timm_resnet18" and row["size"] == "1"
    assert row["imported"] and row["stage"] == "done" and row["reason"] == "", row
    assert row["functions"] > 5 and row["inputs"] == [[[1, 3, 224, 224], "float32"]]
    assert row["fastdlight_ms"] is None and row["tune_s"] is None  # no build, no timing
    assert "| timm_resnet18 | 1 | yes |" in (tmp_path / "bench_zoo_dry.md").read_text()
    assert len((tmp_path / "bench_zoo_dry.jsonl").read_text().splitlines()) == 1


def test_a_case_whose_process_dies_keeps_its_row_and_says_why(tmp_path, monkeypatch):
    """child_case on a stand-in child that saves a row at stage "tune" and aborts, as a CUDA
    illegal address in a tuning measurement does."""
    fake_child(tmp_path, monkeypatch, "fake_child.py",
        "import json, os, sys\n"
        "row_file = sys.argv[sys.argv.index('--row-file') + 1]\n"
        "json.dump({'model': 'gpt2_2l', 'family': 'transformers', 'size': '1x512', 'stage': 'tune',\n"
        "           'imported': True, 'functions': 23, 'torch_eager_ms': 1.9}, open(row_file, 'w'))\n"
        "print(\"terminate called after throwing an instance of 'tvm::ffi::Error'\", file=sys.stderr)\n"
        "print('  what():  CUDA Runtime Error: cudaErrorIllegalAddress (700)', file=sys.stderr)\n"
        "sys.stderr.flush(); os.abort()\n")
    args = bench_zoo.parse_args(["--time-limit", "60"])
    row = bench_zoo.child_case("gpt2_2l", "1x512", args)
    assert row.imported and row.torch_eager_ms == 1.9 and row.stage == "tune"
    assert row.reason == "tune: the process died of SIGABRT (CUDA Runtime Error: cudaErrorIllegalAddress (700))"
    assert "| 23 |" not in bench_zoo.markdown([row]) and "| - | - |" in bench_zoo.markdown([row])


def test_a_case_past_its_time_limit_is_killed_and_names_its_stage(tmp_path, monkeypatch):
    fake_child(tmp_path, monkeypatch, "slow_child.py",
        "import json, sys, time\n"
        "row_file = sys.argv[sys.argv.index('--row-file') + 1]\n"
        "json.dump({'model': 'resnet50', 'family': 'torchvision', 'size': '1', 'stage': 'build'}, open(row_file, 'w'))\n"
        "time.sleep(60)\n")
    t0 = time.perf_counter()
    row = bench_zoo.child_case("resnet50", "1", bench_zoo.parse_args(["--time-limit", "2"]))
    assert time.perf_counter() - t0 < 30
    assert row.reason == "build: time limit (2 s) reached" and row.errors["stopped"].endswith("at stage build")


def test_cases_run_at_once_take_the_gpu_turn_one_at_a_time(tmp_path):
    args = bench_zoo.parse_args(["--jobs", "2"])
    args.gpu_lock = str(tmp_path / "gpu.lock")
    spans, lock = [], threading.Lock()

    def hold(name):
        case = zoo_case.Case("timm_resnet18", "1")
        with zoo_case.gpu_turn(case, args):
            start = time.perf_counter()
            time.sleep(0.3)
            with lock:
                spans.append((start, time.perf_counter()))
        assert "GPU turn wait" in case.row.stage_s or case.row.stage == "GPU turn wait"

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a0, a1), (b0, b1) = sorted(spans)
    assert b0 >= a1  # the second turn began after the first ended


def test_jobs_keep_the_rows_in_the_order_of_the_cases(tmp_path, monkeypatch):
    fake_done_child(tmp_path, monkeypatch,
        "assert '--gpu-lock' in sys.argv\n"
        "time.sleep(0.5 if name == 'resnet50' else 0.0)\n")
    args = bench_zoo.parse_args(["--jobs", "2", "--time-limit", "60"])
    args.gpu_lock = str(tmp_path / "gpu.lock")
    jsonl = tmp_path / "rows.jsonl"
    rows = bench_zoo.run_cases([("resnet50", "1"), ("mobilenet_v2", "1")], args, str(jsonl))
    assert [r.model for r in rows] == ["resnet50", "mobilenet_v2"]
    finished = [json.loads(line)["model"] for line in jsonl.read_text().splitlines()]
    assert finished == ["mobilenet_v2", "resnet50"]  # as each ended


def test_jobs_without_a_time_limit_are_refused_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(bench_zoo, "gpu_missing", lambda: None)
    assert bench_zoo.main(["--models", "resnet50", "--jobs", "2", "--time-limit", "0"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --jobs needs --time-limit > 0 "
                                               "(each case runs in a process of its own)")


def test_resume_keeps_the_finished_cases_and_runs_the_rest(tmp_path, monkeypatch):
    earlier = tmp_path / "earlier.jsonl"
    done = bench_zoo.Row("resnet50", "torchvision", "1", stage="done", fastdlight_ms=1.0, torch_compile_ms=2.0)
    cut = bench_zoo.Row("mobilenet_v2", "torchvision", "1", stage="tune", reason="tune: time limit")
    earlier.write_text("".join(json.dumps(bench_zoo.asdict(r)) + "\n" for r in (done, cut)))
    ran = []

    def fake_run(cases, args, jsonl):
        ran.extend(cases)
        return [bench_zoo.Row(m, "torchvision", s, stage="done", fastdlight_ms=1.0) for m, s in cases]

    monkeypatch.setattr(bench_zoo, "run_cases", fake_run)
    monkeypatch.setattr(bench_zoo, "gpu_missing", lambda: None)
    monkeypatch.setenv("OUT", str(tmp_path))
    assert bench_zoo.main(["--models", "resnet50,mobilenet_v2", "--resume", str(earlier)]) == 0
    assert ran == [("mobilenet_v2", "1")]  # the finished case is kept, the cut one runs again
    rows = json.loads((tmp_path / "bench_zoo.json").read_text())["rows"]
    assert [(r["model"], r["stage"]) for r in rows] == [("resnet50", "done"), ("mobilenet_v2", "done")]


def test_no_case_starts_after_start_before_and_none_is_written_as_finished(tmp_path, monkeypatch):
    fake_done_child(tmp_path, monkeypatch, "time.sleep(0.3)\n")
    args = bench_zoo.parse_args(["--time-limit", "60", "--start-before", "0.1"])
    jsonl = tmp_path / "rows.jsonl"
    rows = bench_zoo.run_cases([("resnet50", "1"), ("mobilenet_v2", "1")], args, str(jsonl))
    assert [r.stage for r in rows] == ["done", "start"] and "--start-before" in rows[1].reason
    assert list(bench_zoo.finished_rows(str(jsonl))) == [("resnet50", "1")]


def test_resume_from_a_file_that_is_not_rows_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "notes.txt"
    bad.write_text("not json\n")
    monkeypatch.setattr(bench_zoo, "gpu_missing", lambda: None)
    assert bench_zoo.main(["--models", "resnet50", "--resume", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == f"error: --resume {bad}: not a bench_zoo.jsonl (one JSON row a line)"


def test_a_run_stopped_by_sigterm_takes_its_running_cases_along():
    """``timeout`` stops the run with SIGTERM; each case runs in a process group of its own, so
    without the handler its tuning processes outlived the run (holding its output open)."""
    code = f"""
import os, signal, subprocess, sys
sys.path.insert(0, {os.path.join(ROOT, 'benchmarks')!r})
import bench_zoo
child = subprocess.Popen(["sleep", "60"], start_new_session=True)
bench_zoo.LIVE_CASES.add(child)
print(child.pid, flush=True)
signal.signal(signal.SIGTERM, bench_zoo.stop_cases)
os.kill(os.getpid(), signal.SIGTERM)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 128 + 15, done.stderr
    assert "--resume continues" in done.stderr
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:
            os.waitpid(pid, os.WNOHANG)  # not our child: only the kernel's reaping is waited for
        except ChildProcessError:
            pass
        time.sleep(0.05)
    with open(f"/proc/{pid}/stat") as f:
        assert f.read().split()[2] == "Z"  # killed, a zombie until its orphan is reaped


def test_gpus_spread_the_cases_each_on_one_gpu_with_that_gpus_turn(tmp_path, monkeypatch):
    """--gpus 0,1 --jobs 2: the two cases running at once see different GPUs and take different
    turn locks; a third case goes to the GPU that a finished case left."""
    fake_done_child(tmp_path, monkeypatch,
        "lock = sys.argv[sys.argv.index('--gpu-lock') + 1]\n"
        "time.sleep(0.6 if name == 'resnet50' else 0.1)\n",
        errors="{'seen': os.environ['CUDA_VISIBLE_DEVICES'] + ' ' + lock}")
    args = bench_zoo.parse_args(["--jobs", "2", "--time-limit", "60", "--gpus", "0,1"])
    args.gpu_lock = str(tmp_path / "gpu.lock")
    rows = bench_zoo.run_cases([("resnet50", "1"), ("mobilenet_v2", "1"), ("swin_t", "1")], args,
                               str(tmp_path / "rows.jsonl"))
    seen = {r.model: r.errors["seen"].split() for r in rows}
    assert seen["resnet50"] == ["0", f"{args.gpu_lock}.0"]
    assert seen["mobilenet_v2"] == ["1", f"{args.gpu_lock}.1"]
    assert seen["swin_t"][0] == "1"  # resnet50 still holds GPU 0


@pytest.mark.parametrize("argv", [["--gpus", "0,1"], ["--gpus", "0,0", "--jobs", "2"], ["--gpus", "a", "--jobs", "2"]])
def test_bad_gpus_are_refused_in_one_line(argv, capsys):
    assert bench_zoo.main(["--models", "resnet50", "--time-limit", "60", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --gpus ") and "\n" not in err


def test_each_gpus_tune_gets_its_share_of_the_cpus_and_the_child_is_told(tmp_path, monkeypatch):
    assert bench_zoo.tune_workers_per_gpu(32, 2) == 15 and bench_zoo.tune_workers_per_gpu(2, 4) == 1
    fake_done_child(tmp_path, monkeypatch, "", errors="{'workers': sys.argv[sys.argv.index('--tune-workers') + 1]}")
    args = bench_zoo.parse_args(["--time-limit", "60", "--tune-workers", "7"])
    assert bench_zoo.child_case("resnet50", "1", args).errors["workers"] == "7"
    assert bench_zoo.parse_args([]).tune_workers == 0  # the tuner's own default


def test_with_several_gpus_each_case_runs_on_its_gpus_slice_of_the_cpus(tmp_path, monkeypatch):
    assert bench_zoo.cpu_share(["0", "1"], "1", list(range(32))) == list(range(16, 32))
    assert bench_zoo.cpu_share(["3", "5", "7"], "5", [0, 2, 4, 6, 8, 10, 12]) == [4, 6]
    assert bench_zoo.cpu_share(["0"], "0", [0, 1]) == [] and bench_zoo.cpu_share([], None) == []
    fake_done_child(tmp_path, monkeypatch, "cpus = sys.argv[sys.argv.index('--cpus') + 1] if '--cpus' in sys.argv else ''\n",
                    errors="{'cpus': cpus}")
    args = bench_zoo.parse_args(["--time-limit", "60", "--jobs", "2", "--gpus", "0,1"])
    mine = sorted(os.sched_getaffinity(0))
    want = ",".join(map(str, mine[len(mine) // 2:]))
    assert bench_zoo.child_case("resnet50", "1", args, "1").errors["cpus"] == want
    assert bench_zoo.child_case("resnet50", "1", bench_zoo.parse_args(["--time-limit", "60"])).errors["cpus"] == ""


def test_a_case_process_pins_itself_to_its_cpus_before_its_work(tmp_path, monkeypatch):
    mine = sorted(os.sched_getaffinity(0))
    seen = []
    monkeypatch.setattr(bench_zoo, "gpu_case", lambda *a, **k: seen.append(sorted(os.sched_getaffinity(0))))
    try:
        bench_zoo.main(["--child", "resnet50:1", "--row-file", str(tmp_path / "row.json"), "--cpus", str(mine[-1])])
    finally:
        os.sched_setaffinity(0, mine)
    assert seen == [[mine[-1]]]


def test_a_case_gets_its_gpu_and_with_others_at_once_a_share_of_torch_compiles_processes():
    env = bench_zoo.case_env({"PATH": "/bin"}, "1", jobs=4, cpus=32)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env[bench_zoo.INDUCTOR_THREADS] == "8" and env["PATH"] == "/bin"
    assert bench_zoo.INDUCTOR_THREADS not in bench_zoo.case_env({}, None, jobs=1, cpus=32)
    assert bench_zoo.case_env({bench_zoo.INDUCTOR_THREADS: "3"}, None, jobs=4, cpus=32)[bench_zoo.INDUCTOR_THREADS] == "3"
