"""What the benchmarks set up the same way: a log under ``$OUT``, cuBLAS held to fp32
accumulation (as fastdlight's kernels accumulate), so the two sides compute the same thing, a
trace of the kernels a call runs, and kernels timed in alternating rounds."""

from __future__ import annotations

import os
import sys


def open_log(name: str):
    """``(out_dir, log)``: ``$OUT`` (or the current directory) and a ``log(msg)`` that prints and
    appends to ``{out_dir}/{name}.log``."""
    out_dir = os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    log_file = open(os.path.join(out_dir, f"{name}.log"), "a")

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    return out_dir, log


def write_results(name: str, data: dict, md: str, echo: bool = True) -> None:
    """``$OUT/{name}.json`` (``data``) and ``$OUT/{name}.md`` (``md``, also printed with
    ``echo``: a benchmark that saves after every case echoes the last time only)."""
    import json

    out_dir = os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(md)
    if echo:
        print(md)


def write_case_results(name: str, arch, rows: list, errors: dict, markdown, **fields) -> None:
    """:func:`write_results` of a run over cases (:func:`each_case`) on ``arch``: the benchmark,
    the device, the date, ``fields``, the rows (dataclass rows as dicts) and the failed cases'
    errors; the markdown is ``markdown(rows, device)``."""
    import dataclasses
    import time

    device = arch.device_name or arch.name
    data = {"benchmark": name, "device": device, "date": time.strftime("%Y-%m-%d"), **fields,
            "rows": [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else r for r in rows], "errors": errors}
    write_results(name, data, markdown(rows, device))


_NOISE = ("Traceback", "File ", "While executing", "Original traceback", "Use tlparse", "Set TORCH_LOGS",
          "For more information", "from user code", "Exception raised from")


def one_line(e: BaseException) -> str:
    """``Type: message``, one line: a TVM error's last line (after its traceback), else the
    message's first line that is not a traceback or a pointer to logs; a first line that ends
    with a colon keeps the two indented lines after it (a tuner's reason and its first example)."""
    text = str(e)
    raw = text.splitlines()
    kept = [i for i, line in enumerate(raw)
            if line.strip() and not line[:1].isspace() and not line.strip().startswith(_NOISE)]
    if text.lstrip().startswith("Traceback"):
        return f"{type(e).__name__}: {raw[kept[-1]].strip() if kept else ''}"[:240]
    line = raw[kept[0]].strip() if kept else ""
    if line.endswith(":"):
        line = " ".join([line, *(t.strip() for t in raw[kept[0] + 1:kept[0] + 3] if t[:1].isspace() and t.strip())])
    return f"{type(e).__name__}: {line}"[:400]


def unknown_names(names, known, what: str) -> str | None:
    """The one-line error for ``names`` not among ``known`` (``what``: "model", "case"), or None."""
    unknown = [n for n in names if n not in known]
    return f"error: unknown {what}(s) {unknown}; known: {', '.join(known)}" if unknown else None


def torch_gpu_missing() -> str | None:
    """Why a benchmark that times torch on the GPU cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "needs torch (and a GPU)"
    return None if torch.cuda.is_available() else "needs a CUDA GPU"


def refusal(bench: str, names, known, what: str) -> str | None:
    """The one-line error a benchmark timing torch on the GPU refuses ``names`` with: an
    unknown name (checked first, without torch), or no torch or GPU here; None to go on."""
    why = unknown_names(names, known, what)
    if why is None and (missing := torch_gpu_missing()):
        why = f"error: {bench} {missing}"
    return why


def chosen_cases(bench: str, only, known) -> list[str] | None:
    """The cases ``--only`` names (all of ``known`` where it names none), or None once the
    one-line refusal (:func:`refusal`) is printed."""
    names = list(only) or list(known)
    why = refusal(bench, names, known, "case")
    if why:
        print(why, file=sys.stderr)
        return None
    return names


def cases_to_run(bench: str, args, cases, listing: str, refusals=()):
    """The case names a benchmark's parsed ``args`` ask for (``--only``), or its exit code:
    0 once ``--list`` printed ``listing``, 2 once the first of ``refusals`` that is a one-line
    complaint (a string; parsed values are not) or an unknown case name was printed."""
    if args.list:
        print(listing)
        return 0
    refused = next((r for r in refusals if isinstance(r, str)), None)
    if refused is not None:
        print(refused, file=sys.stderr)
        return 2
    names = chosen_cases(bench, args.only, cases)
    return 2 if names is None else names


def case_arguments(bench: str, description: str, cases, argv, topk: int):
    """A case benchmark's ``--only``, ``--topk`` and ``--list``: ``(args, names)``, or the exit
    code once ``--list`` printed the cases (0) or a name was refused in one line (2)."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--only", nargs="*", default=[], help="case names (default: all)")
    ap.add_argument("--topk", type=int, default=topk)
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args(argv)
    names = cases_to_run(bench, args, cases, "\n".join(cases))
    return names if isinstance(names, int) else (args, names)


def table(title: str, header: list[str], rows: list[list]) -> str:
    """A markdown table under a title line: ``header``'s columns, a row of cells each."""
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def rounds_parser(description: str, round_ms: float):
    """The arguments of a benchmark that times fixed configs in alternating rounds
    (:func:`timed_rounds`): ``--only``, ``--rounds``, ``--round-ms``, ``--list``; the caller adds its own."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--only", nargs="*", default=[], help="case names (default: all)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--round-ms", type=float, default=round_ms)
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    return ap


def gpu_arch():
    """GPU 0's :class:`~fastdlight.arch.CUDA`, with cuBLAS held to fp32 accumulation."""
    import tvm

    from fastdlight.arch import CUDA

    torch_fp32_accumulation()
    return CUDA.from_device(tvm.cuda(0))


def each_case(names, run_one) -> tuple[list, dict[str, str]]:
    """``run_one(name)`` for each case (a row, or a list of rows), and each failed case's
    one-line error by name: a case that fails is reported and the run goes on."""
    rows, errors = [], {}
    for name in names:
        try:
            got = run_one(name)
            rows.extend(got if isinstance(got, list) else [got])
        except Exception as e:  # noqa: BLE001 - a case of its own, the run goes on
            errors[name] = one_line(e)
            print(f"[{name}] failed: {errors[name]}", flush=True)
    return rows, errors


def run_cases(bench: str, names, arch, run_one, markdown, finish=None) -> int:
    """A fixed-config benchmark's run: each case's name printed, then its rows by
    ``run_one(name)`` (:func:`each_case`), ``finish()`` (where given), the results written with
    the run's seconds (:func:`write_case_results`); the exit code: 0 when every case gave rows."""
    import time

    t0 = time.perf_counter()

    def one(name: str):
        print(f"[{name}]", flush=True)
        return run_one(name)

    rows, errors = each_case(names, one)
    if finish is not None:
        finish()
    write_case_results(bench, arch, rows, errors, markdown, seconds=round(time.perf_counter() - t0, 1))
    return 0 if rows and not errors else 1


def torch_fp32_accumulation() -> None:
    import torch

    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_tf32 = False


#: calls :func:`kernel_trace` records
TRACE_CALLS = 20


def kernel_trace(fn) -> list[dict]:
    """Every GPU kernel of ``fn()`` as it runs (CUPTI through torch.profiler, which sees the
    kernels TVM launches too): device microseconds and launches per call, longest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(TRACE_CALLS):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        us = e.cuda_time_total if us is None else us
        if us and e.count >= TRACE_CALLS:  # kernels of every call, not one-off setup copies
            rows.append({"kernel": e.key[:90], "us": round(us / TRACE_CALLS, 2), "launches": e.count // TRACE_CALLS})
    return sorted(rows, key=lambda r: -r["us"])


class KernelTimer:
    """``ms -> median ms a launch`` of one built kernel (a :class:`CompileResult`), replayed
    from a CUDA graph over the workload's rotated input copies ``sets``."""

    def __init__(self, result, sets, dev):
        from fastdlight.measure.timing import function_name

        self.launch = result.module[function_name(result.module, result._func)]
        self.sets, self.dev, self.per_launch = sets, dev, max(result.latency_ms or 0.01, 0.002)

    def __call__(self, ms: float) -> float:
        from fastdlight.measure.graph_timing import time_graph

        return time_graph(self.launch, self.sets, self.dev, ms, self.per_launch).median_ms


def timed_rounds(timers: dict, rounds: int, round_ms: float) -> tuple[dict, dict]:
    """Median of ``rounds`` timings of each timer (``ms -> median ms``), in alternating order,
    each after an untimed run of its own, so that clocks and neighbours drift alike for all; a
    timer that raises is dropped (its error kept)."""
    times, errors = {k: [] for k in timers}, {}
    keys = list(timers)
    for i in range(rounds):
        for key in keys if i % 2 == 0 else keys[::-1]:
            if key in errors:
                continue
            try:
                timers[key](round_ms / 3)
                times[key].append(timers[key](round_ms))
            except Exception as e:  # noqa: BLE001 - a row with its error
                errors[key] = one_line(e)[:300]
    return {k: (sorted(v)[len(v) // 2] if v and k not in errors else None) for k, v in times.items()}, errors


class Sampler:
    """SM clock (MHz) and power (W) from ``nvidia-smi``, sampled in a thread."""

    def __init__(self):
        import threading

        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        import subprocess
        import time

        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout.split(",")
                self.samples.append((time.perf_counter(), float(out[0]), float(out[1])))
            except Exception:  # noqa: BLE001 - no reading this time
                time.sleep(0.1)

    def between(self, t0: float, t1: float) -> dict:
        return self.within([(t0, t1)])

    def within(self, spans) -> dict:
        """Mean clock and power of the samples inside any of ``spans`` ((start, end) pairs)."""
        rows = [s for s in self.samples if any(t0 <= s[0] <= t1 for t0, t1 in spans)]
        if not rows:
            return {"clock_mhz": None, "power_w": None}
        return {"clock_mhz": sum(r[1] for r in rows) / len(rows), "power_w": sum(r[2] for r in rows) / len(rows)}

    def stop(self):
        self._stop.set()
