"""What a tuning run prints: the ranked table, performance in TFLOPS or GB/s, why candidates failed."""

from __future__ import annotations

import collections
from typing import Sequence

from fastdlight.search.results import STAGES, CompileResult


def _reason(r: CompileResult) -> str | None:
    if r.verified is False:
        return "wrong result"
    if r.failure is None:
        return None
    return r.failure.stage if r.failure.stage in STAGES else r.error


def failure_counts(results: Sequence[CompileResult]) -> str:
    """'2 wrong result, 1 nvcc' (empty when nothing failed)."""
    counts = collections.Counter(filter(None, map(_reason, results)))
    return ", ".join(f"{n} {reason}" for reason, n in counts.most_common())


def failure_summary(results: Sequence[CompileResult], limit: int = 3) -> str:
    """'N × reason' per reason, with the first few one-line messages of each."""
    by_reason: dict[str, list[CompileResult]] = collections.defaultdict(list)
    for r in results:
        reason = _reason(r)
        if reason:
            by_reason[reason].append(r)
    lines = []
    for reason, rs in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(rs)} × {reason}")
        for r in rs[:limit]:
            msg = r.check_message if reason == "wrong result" else r.error
            lines.append(f"      #{r.index} {r.config!r}: {msg}")
    return "\n".join(lines)


def perf_text(r: CompileResult, flops: float | None = None, nbytes: float | None = None,
              memory_bound: bool | None = None) -> str:
    if r.latency_ms is None:
        return "-"
    secs = r.latency_ms * 1e-3
    if memory_bound is None:
        memory_bound = not flops
    if memory_bound and nbytes:
        return f"{nbytes / secs / 1e9:.0f} GB/s"
    if flops:
        return f"{flops / secs / 1e12:.1f} TFLOPS"
    return "-"


def format_table(results: Sequence[CompileResult], flops: float | None = None, nbytes: float | None = None,
                 memory_bound: bool | None = None, best: CompileResult | None = None) -> str:
    """The ranked table the CLI and ``verbose=True`` print."""
    perf_head = "GB/s" if (memory_bound or (memory_bound is None and not flops)) else "TFLOPS"
    rows = [("rank", "#", "config", "pred. cost (policy units)", "ms", perf_head, "ok", "regs", "note")]
    for i, r in enumerate(results, 1):
        ok = {True: "yes", False: "WRONG", None: "-"}[r.verified]
        note = r.error or ("" if r.verified is not False else r.check_message)
        if r is best:
            note = "best" + (f"; {note}" if note else "")
        if r.spill_bytes:
            note = f"spills {r.spill_bytes} B" + (f"; {note}" if note else "")
        rows.append((
            str(i), str(r.index), repr(r.config), f"{r.predicted_cost:.4g}",
            "-" if r.latency_ms is None else f"{r.latency_ms:.4f}", perf_text(r, flops, nbytes, memory_bound),
            ok, "-" if r.registers is None else str(r.registers), note[:90],
        ))  # fmt: skip
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    lines.insert(1, "-" * min(200, len(lines[0])))
    return "\n".join(line.rstrip() for line in lines)
