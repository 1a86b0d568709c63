"""check_decode_splits (CPU): the split counts a case tries, its list syntax, refusals and table."""

import json
import os
import subprocess
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "check_decode_splits.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_setup  # noqa: E402
import check_decode_splits as cds  # noqa: E402


def test_the_counts_tried_surround_the_default_and_one_chunk_where_the_pairs_fill_the_sms():
    assert cds.split_counts(1, 32, 132) == [16, 24, 32]
    assert cds.split_counts(16, 32, 132) == [1, 2]  # the default is one chunk there
    assert cds.split_counts(1, 1, 132) == [128]  # capped at the most chunks


def test_lists_parse_and_a_bad_item_is_named():
    assert cds.parse_list("17, 26") == [17, 26]
    assert cds.parse_list("pair", cds.FORMS) == ["pair"]
    assert "--splits" in cds.parse_list("17,0")
    assert "'both'" in cds.parse_list("step,both", cds.FORMS)


def test_a_bad_count_form_or_case_is_one_line_and_exit_2():
    for argv in (["--splits", "x"], ["--forms", "both"], ["--only", "b2_h8"]):
        done = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_the_table_has_a_row_each_with_dashes_for_what_is_missing():
    rows = [{"case": "b1_h32", "splits": 17, "form": "step", "config": "block=[16], thread=[8]", "ms": 0.02,
             "tbs": 3.35, "vs_torch": 1.083, "registers": 64, "verified": True, "error": ""},
            {"case": "b1_h32", "splits": None, "form": "torch SDPA", "config": "", "ms": None, "tbs": None,
             "vs_torch": 1.0, "error": "RuntimeError: x"}]
    md = cds.markdown(rows, "NVIDIA H200").splitlines()
    assert md[-2].startswith("| b1_h32 | 17 | step | block=[16], thread=[8] | 0.0200 | 3.35 | 1.083x | 64 | True |")
    assert md[-1] == "| b1_h32 | - | torch SDPA | - | - | - | 1.000x | - | - | RuntimeError: x |"


def test_a_run_of_cases_writes_every_row_and_each_failure_and_exits_by_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    arch = types.SimpleNamespace(device_name="NVIDIA H200", name="cuda")
    finished = []

    def run_one(name):
        if name == "bad":
            raise RuntimeError("no GPU memory\nmore")
        return [{"case": name, "ms": 1.0}]

    code = bench_setup.run_cases("check_x", ["good", "bad"], arch, run_one, lambda rows, device: f"{len(rows)} rows\n",
                                 finish=lambda: finished.append(True))
    data = json.loads((tmp_path / "check_x.json").read_text())
    assert code == 1 and finished == [True]
    assert data["rows"] == [{"case": "good", "ms": 1.0}] and data["errors"] == {"bad": "RuntimeError: no GPU memory"}
    assert "[good]" in capsys.readouterr().out and (tmp_path / "check_x.md").read_text() == "1 rows\n"
    assert bench_setup.run_cases("check_x", ["good"], arch, run_one, lambda rows, device: "") == 0


def test_the_cases_to_run_or_the_exit_code_of_a_listing_or_a_refusal(capsys):
    cases = {"a": 1, "b": 2}
    ask = lambda **kw: types.SimpleNamespace(**({"list": False, "only": []} | kw))  # noqa: E731
    assert bench_setup.cases_to_run("x", ask(list=True), cases, "a\nb") == 0 and capsys.readouterr().out == "a\nb\n"
    assert bench_setup.cases_to_run("x", ask(), cases, "", ([17], "x: bad --splits", "later")) == 2
    assert capsys.readouterr().err == "x: bad --splits\n"
    assert bench_setup.cases_to_run("x", ask(only=["c"]), cases, "", ([17],)) == 2
    assert "unknown case(s) ['c']; known: a, b" in capsys.readouterr().err
