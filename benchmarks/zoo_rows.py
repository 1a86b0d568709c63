"""The rows of ``bench_zoo`` and their tables: one :class:`Row` per case (model and size), the
markdown table, and the summary line with the geometric means."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields


@dataclass
class Row:
    model: str
    family: str
    size: str
    inputs: list = field(default_factory=list)  # [shape, dtype] of each input
    device: str = ""
    stage: str = ""  # the stage running (or that failed); "done" when the case finished
    imported: bool = False  # through torch.export, the importer, for_inference and prepare
    reason: str = ""  # the first failure, one line, with its stage
    functions: int = 0  # PrimFuncs of the prepared module
    max_rel_err: float | None = None  # max |fastdlight - torch fp16| / max |torch fp16|
    torch_eager_ms: float | None = None
    torch_graph_ms: float | None = None
    torch_compile_ms: float | None = None
    stock_ms: float | None = None  # the for_inference module through tvm.compile (stock Dlight)
    fastdlight_ms: float | None = None
    tune_s: float | None = None  # cold (an empty database unless --db names a filled one)
    tune_db_s: float | None = None  # the same module again, from the database the cold pass filled
    db_hits: int = 0  # functions the second pass took from the database
    build_s: float | None = None
    untuned: list = field(default_factory=list)
    winners: dict = field(default_factory=dict)  # fastdlight / stock / view / untuned -> functions
    #: [function, status, winner, ms, stock ms, the winning config's kind, its place among the policy's
    #: configs (0: first), candidates built, [[4, fastest of the policy's first 4 ms], [8, ...]]]
    #: per function
    report: list = field(default_factory=list)
    errors: dict = field(default_factory=dict)  # failures that did not stop the case (torch.compile, ...)
    seconds: float | None = None
    stage_s: dict = field(default_factory=dict)  # seconds each stage took (where a case's time goes)
    tune_stage_s: dict = field(default_factory=dict)  # the cold tune's seconds per tuner stage (clock)


def new_row(name: str, spec, size: str, **fields) -> Row:
    """A case's row before any stage has run: the model, its family, its inputs at ``size``."""
    return Row(name, spec.family, size, inputs=[[list(shape), dtype] for shape, dtype in spec.inputs_at(size)], **fields)


#: lines of an error's message that say nothing of the error itself
def row_from(data: dict) -> Row:
    names = {f.name for f in fields(Row)}
    return Row(**{k: v for k, v in data.items() if k in names})


def _ms(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else "-"


def _ratio(other, ours) -> str:
    return f"{other / ours:.2f}x" if other and ours else "-"


def markdown(rows: list[Row], dry: bool = False) -> str:
    if dry:
        lines = ["| model | size | imported | functions | s | reason |", "|---|---|---|---|---|---|"]
        lines += [f"| {r.model} | {r.size} | {'yes' if r.imported else 'no'} | {r.functions or '-'} | {r.seconds} "
                  f"| {r.reason} |" for r in rows]
        return "\n".join(lines) + "\n"
    head = ("| model | size | imported | max rel err | torch eager ms | torch graph ms | torch.compile ms "
            "| stock Dlight ms | fastdlight ms | vs eager | vs graph | vs compile | vs stock | tune s cold "
            "| tune s db (hits) | untuned | won fastdlight/stock | reason |")
    lines = [head, "|" + "---|" * 18]
    for r in rows:
        err = f"{r.max_rel_err:.1e}" if r.max_rel_err is not None else "-"
        untuned = f"{len(r.untuned)}/{r.functions}" if r.tune_s is not None else "-"
        won = f"{r.winners.get('fastdlight', 0)}/{r.winners.get('stock', 0)}" if r.winners else "-"
        db = f"{r.tune_db_s} ({r.db_hits})" if r.tune_db_s is not None else "-"
        lines.append(
            f"| {r.model} | {r.size} | {'yes' if r.imported else 'no'} | {err} | {_ms(r.torch_eager_ms)} "
            f"| {_ms(r.torch_graph_ms)} | {_ms(r.torch_compile_ms)} | {_ms(r.stock_ms)} | {_ms(r.fastdlight_ms)} "
            f"| {_ratio(r.torch_eager_ms, r.fastdlight_ms)} | {_ratio(r.torch_graph_ms, r.fastdlight_ms)} "
            f"| {_ratio(r.torch_compile_ms, r.fastdlight_ms)} | {_ratio(r.stock_ms, r.fastdlight_ms)} "
            f"| {r.tune_s if r.tune_s is not None else '-'} | {db} "
            f"| {untuned} | {won} | {r.reason} |")
    return ("\n".join(lines) + "\n\n" + summary(rows) + "\n\nRatios are torch's time over fastdlight's "
            "(> 1: fastdlight faster). max rel err: against torch fp16, relative to its largest output.\n")


#: the columns a geometric mean is taken of, as (label, Row field)
BASELINES = (("torch eager", "torch_eager_ms"), ("torch graph", "torch_graph_ms"),
             ("torch.compile", "torch_compile_ms"), ("stock Dlight", "stock_ms"))


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(rows: list[Row]) -> str:
    """How many cases ran, and fastdlight's geometric-mean speedup over each baseline (over the
    cases that have both times; the count says how many)."""
    done = [r for r in rows if r.stage == "done"]
    parts = [f"{len(done)} of {len(rows)} cases ran end to end"]
    for label, name in BASELINES:
        pairs = [getattr(r, name) / r.fastdlight_ms for r in done if getattr(r, name) and r.fastdlight_ms]
        if pairs:
            parts.append(f"geomean vs {label} {geomean(pairs):.2f}x ({len(pairs)})")
    slow = [f"{r.tune_s:.0f} s {r.model}" for r in done if r.tune_s is not None and r.tune_s > 60]
    if slow:
        parts.append("tuned over 60 s cold: " + ", ".join(slow))
    return "; ".join(parts) + "."
