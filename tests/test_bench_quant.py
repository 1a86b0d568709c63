"""benchmarks/bench_quant.py on the CPU: the cases it lists, and the one line it refuses with."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_quant  # noqa: E402
import bench_setup  # noqa: E402


def test_the_issue_cases_are_listed(capsys):
    assert bench_quant.main(["--list"]) == 0
    listed = capsys.readouterr().out.split("\n")
    assert "fp8 4096³" in listed and "fp8 8192³" in listed and "w4a16 decode 1×11008×4096" in listed
    assert {c.kind for c in bench_quant.CASES.values()} == {"fp8", "w4_decode", "w4_prefill"}


def test_an_unknown_case_is_refused_in_one_line(capsys):
    assert bench_quant.main(["--only", "fp8 4096"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fp8 4096" in err[0]


def test_the_table_has_a_row_per_case():
    row = bench_quant.Row("fp8 4096³", 0.1, "torch._scaled_mm", 0.12, 1.2, "1374 TFLOPS", "1145 TFLOPS",
                          "Config[matmul_wgmma]", 5.0)
    text = bench_quant.markdown([row], "NVIDIA H200")
    assert "| fp8 4096³ | 0.1000 | torch._scaled_mm | 0.1200 | 1.20x | 1374 TFLOPS |" in text


def test_each_case_keeps_the_rows_and_a_failed_cases_one_line_error(capsys):
    def one(name):
        if name == "bad":
            raise RuntimeError("Traceback (most recent call last):\n  File x\nValueError: odd shape")
        return [name, name] if name == "two" else name

    rows, errors = bench_setup.each_case(["a", "bad", "two"], one)
    assert rows == ["a", "two", "two"] and list(errors) == ["bad"]
    assert errors["bad"] == "RuntimeError: ValueError: odd shape" and "[bad] failed" in capsys.readouterr().out


def test_a_tuners_failure_keeps_its_reason_on_the_line():
    """A message ending its first line with a colon (the tuner's "none verified:") keeps the
    reason and its first example: without them a results file says only that something failed."""
    error = RuntimeError("no candidate could be used (3 tried, none verified):\n  3 × wrong result\n"
                         "      #0 Config[x]: 12 of 64 elements out of bound\n      #1 Config[y]: ...")
    assert bench_setup.one_line(error) == ("RuntimeError: no candidate could be used (3 tried, none verified): "
                                           "3 × wrong result #0 Config[x]: 12 of 64 elements out of bound")
