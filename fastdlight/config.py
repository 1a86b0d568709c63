"""What a candidate is: the tile config ("hint") a policy emits and a schedule template consumes
(:class:`Config`), or a schedule measured beside them that carries no tiles: stock Dlight's
(:class:`StockSchedule`) and a MetaSchedule record's (:class:`MetaScheduleRecord`).

Axis conventions (the contract between policies and templates):

* ``block``, ``thread`` and ``warp`` have one entry per *spatial* axis of the function's
  output-defining block (its iter vars in order, see ``analysis.FuncInfo.spatial_axes``).
  For the tensor-core kinds (``matmul_tc``, ``matmul_wgmma``) they are instead over the normalized matmul view
  ``C[S, I, J] += A[S, I, K] * B[S, J, K]`` and have exactly two entries ``(I, J)``;
  one block always covers one batch index ``S``.
* ``block[i]``  – output elements one thread block computes along axis ``i``.
* ``thread[i]`` – output elements one thread computes along axis ``i`` (its micro tile), so
  the block has ``block[i] // thread[i]`` threads along axis ``i``.
* ``warp[i]``   – tensor-core only: output elements one warp (wgmma: one consumer warpgroup)
  computes along axis ``i``.
* ``rstep[r]``  – reduction elements per main-loop step along reduction axis ``r``
  (the shared-memory stage for matmul-like kernels).
* ``reduce_thread[r]`` – threads cooperating on reduction axis ``r`` (cross-thread reduction).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar, Union

#: Template families a config can be for; each maps to one module in ``fastdlight.schedules``.
KINDS = (
    "elementwise",  # injective / broadcast, no reduction
    "transpose",  # injective with a transposed input: tiles staged through shared memory
    "reduction",  # one reduction block (+ optional elementwise around it)
    "general_reduction",  # several reductions + elementwise over the same rows (softmax, norms)
    "gemv",  # matrix-vector and low-batch (M <= 16) matrix-matrix
    "gemv_dequant",  # decode rows against 4- or 8-bit weights, dequantized in registers: block=(rows,), thread=(rows a warp,)
    "gemv_dequant_mma",  # the same on tensor cores (mma.sync): block=(rows,) in 16-row tiles, warp=(warps splitting K,)
    "matmul",  # CUDA-core tiled reduction: matmul, batch matmul, conv (implicit GEMM)
    "matmul_tc",  # tensor-core matmul (ldmatrix + mma.sync)
    "matmul_wgmma",  # Hopper tensor-core matmul (TMA + wgmma, warp-specialized; sm_90a)
    "matmul_wgmma_dequant",  # prefill rows against 4-bit weights on Hopper: block=(weight rows, activation rows); sm_90a
    "attention_wgmma",  # fused attention on Hopper: block = (query rows, keys a step); sm_90a
    "attention_mma",  # fused attention with mma.sync (sm_80+): block = (query rows, keys a step), warp = (rows a warp,)
    "decode_attention",  # split-KV decode attention: block=(keys a step,), thread=(values of a key a lane,), warp=(warps,)
    "decode_attention_mma",  # the same chunk step on mma.sync: block=(16 keys a warp step,), warp=(warps,)
    "decode_combine",  # the merge of its chunks: block=(head dim,), thread=(values a lane,), warp=(warps,)
    "dlight",  # TVM's stock Dlight rules at ``arch``: the baseline every tuning run measures too
    "prebuilt",  # a function the caller scheduled (``@fastdlight.autotune``): block=(candidate number,)
    "ms_record",  # a MetaSchedule tuning record's schedule (its trace, as JSON, in ``trace``)
)

#: the kinds a :class:`Config` can have (stock Dlight and MetaSchedule records have types of their own)
TILE_KINDS = tuple(k for k in KINDS if k not in ("dlight", "ms_record"))

#: kinds whose ``block``/``warp`` are over the normalized matmul view ``(I, J)``
TENSOR_CORE_KINDS = ("matmul_tc", "matmul_wgmma", "matmul_wgmma_dequant")


@dataclass(frozen=True)
class Config:
    """One point of the search space. Immutable, hashable, JSON-friendly."""

    kind: str
    block: tuple[int, ...]
    thread: tuple[int, ...] = ()
    rstep: tuple[int, ...] = ()
    reduce_thread: tuple[int, ...] = ()
    warp: tuple[int, ...] = ()
    #: widest vector (elements) used to load each input / store the output, by buffer name
    vectorize: tuple[tuple[str, int], ...] = ()
    pipeline_stages: int = 1
    use_async_copy: bool = False
    #: panel width of blockIdx swizzling (0 = plain row-major launch order)
    rasterization: int = 0
    #: slices the reduction is cut into (split-K), 1 = no split. matmul_tc: the partial sums are
    #: added by a second kernel that also runs the epilogue; gemv_dequant: by the CTAs of a
    #: thread-block cluster (one a slice), through distributed shared memory
    split_k: int = 1
    #: matmul_wgmma only: CTAs of a thread-block cluster (1 or 2); along M (``cluster_axis``
    #: "m") they compute vertically adjacent tiles and each loads half of their shared B tile,
    #: multicast to both; along N ("n"), horizontally adjacent tiles sharing A
    cluster: int = 1
    cluster_axis: str = "m"
    #: attention_wgmma: a CTA per SM walks the query tiles (instead of a CTA per tile);
    #: gemv_dequant: as many CTAs as the SMs hold at once walk the row blocks
    persistent: bool = False
    #: the policy's predicted cost (lower is better); not part of the config's identity
    cost: float = field(default=0.0, compare=False)

    def __post_init__(self):
        # Normalize lists from JSON into tuples so equality/hash work after a round trip.
        for name in ("block", "thread", "rstep", "reduce_thread", "warp"):
            object.__setattr__(self, name, tuple(int(x) for x in getattr(self, name)))
        vec = self.vectorize
        if isinstance(vec, dict):
            vec = vec.items()
        object.__setattr__(self, "vectorize", tuple(sorted((str(k), int(v)) for k, v in vec)))
        self.validate()

    # -- derived quantities -------------------------------------------------------------
    @property
    def threads_per_axis(self) -> tuple[int, ...]:
        if self.kind in TENSOR_CORE_KINDS:
            return tuple(b // w for b, w in zip(self.block, self.warp))
        return tuple(b // t for b, t in zip(self.block, self.thread))

    #: TVM's stock Dlight schedule (the baseline)? Never for a tile config
    is_stock: ClassVar[bool] = False

    @property
    def num_threads(self) -> int:
        """Threads in one block (tensor-core configs: warps × 32; wgmma: a producer warpgroup
        and two consumer warpgroups, three for a tile of three 64-row warp tiles)."""
        if self.kind == "matmul_wgmma":
            return 128 * (1 + (3 if self.block[0] == 3 * self.warp[0] else 2))
        if self.kind == "matmul_wgmma_dequant":
            return 128 * (1 + self.block[0] // self.warp[0])  # a producer and a warpgroup per 64 weight rows
        if self.kind == "attention_wgmma":
            return 128 * (1 + self.block[0] // 64)  # a producer and a warpgroup per 64 query rows
        if self.kind == "attention_mma":
            return 32 * self.block[0] // (self.warp[0] if self.warp else 16)  # a warp per 16 or 32 query rows
        if self.kind == "matmul_tc":
            return math.prod(self.threads_per_axis) * 32
        if self.kind in ("decode_attention", "decode_attention_mma", "decode_combine", "gemv_dequant_mma"):
            return 32 * self.warp[0]
        return math.prod(self.threads_per_axis) * math.prod(self.reduce_thread or (1,))

    @property
    def num_warps(self) -> int:
        return max(1, self.num_threads // 32)

    def vector_width(self, buffer_name: str, default: int = 1) -> int:
        return dict(self.vectorize).get(buffer_name, default)

    # -- checks and (de)serialization ---------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError unless the fields fit the kind. The checks run in a fixed order, so
        a config wrong in two ways always names the same fault."""
        if self.kind in ("dlight", "ms_record"):
            raise ValueError(f"a {self.kind!r} schedule is a {_RECORD_TYPES[self.kind].__name__}, not a tile Config")
        if self.kind not in TILE_KINDS:
            raise ValueError(f"unknown config kind {self.kind!r}; expected one of {TILE_KINDS}")
        if self.kind == "prebuilt":
            self._validate_prebuilt()
            return
        if not self.block or any(b <= 0 for b in self.block):
            raise ValueError(f"block tile must be positive, got {self.block}")
        # the attention, decode and dequantizing-mma kinds fix every knob in their own check
        if self.kind in ("attention_wgmma", "attention_mma"):
            self._validate_attention()
        elif self.kind == "gemv_dequant_mma":
            self._validate_gemv_dequant_mma()
        elif self.kind == "decode_attention_mma":
            self._validate_decode_attention_mma()
        elif self.kind in ("decode_attention", "decode_combine"):
            self._validate_decode()
        else:
            if self.kind in TENSOR_CORE_KINDS:
                self._validate_warp_tiles()
            else:
                self._validate_thread_tiles()
            self._validate_knobs()

    def _validate_prebuilt(self) -> None:
        if len(self.block) != 1 or self.block[0] < 0 or self.thread or self.rstep or self.reduce_thread \
                or self.warp or self.vectorize:
            raise ValueError("a prebuilt config is block=(candidate number,) only: the caller scheduled it")

    def _validate_attention(self) -> None:
        if self.kind == "attention_mma":
            rows = self.warp[0] if self.warp else 16
            if len(self.block) != 2 or self.warp not in ((), (16,), (32,)) or self.block[0] % rows \
                    or self.thread or self.rstep:
                raise ValueError("an mma.sync attention config is block=(query rows, keys a step) and optionally "
                                 "warp=(16 or 32 query rows a warp, dividing the block's,) only")
        elif len(self.block) != 2 or self.block[0] % 64 or self.thread or self.warp or self.rstep:
            raise ValueError("an attention config is block=(query rows, a multiple of 64; keys a step) only")
        if self.pipeline_stages < 1 or self.cluster != 1 or self.split_k != 1:
            raise ValueError("an attention config has pipeline_stages >= 1, no cluster and no split-K")

    def _validate_gemv_dequant_mma(self) -> None:
        if len(self.block) != 1 or self.block[0] % 16 or len(self.warp) != 1 or self.warp[0] <= 0 \
                or self.thread or self.rstep or self.split_k != 1 or self.cluster != 1 or self.persistent:
            raise ValueError("a gemv_dequant_mma config is block=(rows, a multiple of 16,), warp=(warps,) and "
                             "pipeline_stages (steps of K loaded ahead) only")

    def _validate_decode_attention_mma(self) -> None:
        if self.block != (16,) or len(self.warp) != 1 or self.warp[0] <= 0 or self.thread or self.rstep \
                or self.split_k != 1 or self.cluster != 1 or self.persistent or self.pipeline_stages != 1:
            raise ValueError("a decode_attention_mma config is block=(16,), warp=(warps,) only")

    def _validate_decode(self) -> None:
        """decode_attention and decode_combine: one axis, its lane and warp counts."""
        if len(self.block) != 1 or len(self.thread) != 1 or len(self.warp) != 1 or min(self.thread + self.warp) <= 0 \
                or self.rstep or self.split_k != 1 or self.cluster != 1 or self.persistent:
            raise ValueError("a decode attention or combine config is block=(...,), thread=(values a lane,), "
                             "warp=(warps,) only")

    def _validate_warp_tiles(self) -> None:
        """The tensor-core kinds: warp tiles over the (I, J) matmul view, one K step."""
        if len(self.block) != 2 or len(self.warp) != 2:
            raise ValueError("tensor-core configs need block=(I, J) and warp=(I, J)")
        for b, w in zip(self.block, self.warp):
            if w <= 0 or b % w:
                raise ValueError(f"warp tile {self.warp} must divide block tile {self.block}")
        if len(self.rstep) != 1:
            raise ValueError("tensor-core configs need exactly one rstep (K)")

    def _validate_thread_tiles(self) -> None:
        if len(self.thread) != len(self.block):
            raise ValueError(f"thread tile {self.thread} must have the rank of block {self.block}")
        for b, t in zip(self.block, self.thread):
            if t <= 0 or b % t:
                raise ValueError(f"thread tile {self.thread} must divide block tile {self.block}")

    def _validate_knobs(self) -> None:
        """Reduction steps, pipelining, clusters, split-K and vector widths of the tiled kinds."""
        if self.reduce_thread and len(self.reduce_thread) != len(self.rstep):
            raise ValueError("reduce_thread needs one entry per reduction axis (rstep)")
        if any(r <= 0 for r in self.rstep + self.reduce_thread):
            raise ValueError("rstep and reduce_thread must be positive")
        if self.pipeline_stages < 1:
            raise ValueError("pipeline_stages must be >= 1")
        if self.cluster not in (1, 2) or (self.cluster > 1 and self.kind != "matmul_wgmma"):
            raise ValueError(f"cluster must be 1, or 2 for matmul_wgmma configs (got {self.cluster})")
        if self.cluster_axis not in ("m", "n") or (self.cluster_axis == "n" and self.cluster == 1):
            raise ValueError(f"cluster_axis must be 'm', or 'n' for a cluster (got {self.cluster_axis!r})")
        if self.persistent and self.kind != "gemv_dequant":
            raise ValueError("persistent is an attention_wgmma or gemv_dequant config's knob only")
        if self.split_k < 1 or (self.split_k > 1 and self.kind not in ("matmul_tc", "gemv_dequant")):
            raise ValueError(f"split_k must be >= 1, and > 1 only for matmul_tc and gemv_dequant configs "
                             f"(got {self.split_k})")
        for name, width in self.vectorize:
            if width <= 0 or width & (width - 1):
                raise ValueError(f"vector width of {name} must be a power of two, got {width}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["vectorize"] = dict(self.vectorize)
        if not self.persistent:  # records written before the field read the same
            del d["persistent"]
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "Config":
        known = {f.name for f in fields(cls)}
        # rows written when stock Dlight and MetaSchedule records rode in a tile config
        data = {k: v for k, v in data.items() if not (k in ("arch", "trace") and not v)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown Config fields: {sorted(unknown)}")
        return cls(**data)

    def __repr__(self) -> str:
        if self.kind == "prebuilt":
            return f"Config[prebuilt](#{self.block[0]})"
        parts = [f"block={list(self.block)}"]
        if self.kind in TENSOR_CORE_KINDS or self.kind == "attention_mma" and self.warp:
            parts.append(f"warp={list(self.warp)}")
        elif self.thread:
            parts.append(f"thread={list(self.thread)}")
        if self.kind in ("decode_attention", "decode_attention_mma", "decode_combine", "gemv_dequant_mma"):
            parts.append(f"warp={list(self.warp)}")  # warps a CTA: configs differing only in them differ
        if self.rstep:
            parts.append(f"rstep={list(self.rstep)}")
        if any(r > 1 for r in self.reduce_thread):
            parts.append(f"rthread={list(self.reduce_thread)}")
        if self.vectorize:
            parts.append("vec={" + ", ".join(f"{k}:{v}" for k, v in self.vectorize) + "}")
        if self.pipeline_stages > 1:
            parts.append(f"stages={self.pipeline_stages}")
        if self.use_async_copy:
            parts.append("async")
        if self.split_k > 1:
            parts.append(f"split_k={self.split_k}")
        if self.rasterization:
            parts.append(f"{'group_m' if self.kind == 'matmul_wgmma' else 'raster'}={self.rasterization}")
        if self.cluster > 1:
            parts.append(f"cluster{'_n' if self.cluster_axis == 'n' else ''}={self.cluster}")
        if self.persistent:
            parts.append("persistent")
        return f"Config[{self.kind}]({', '.join(parts)})"


@dataclass(frozen=True)
class StockSchedule:
    """TVM's stock Dlight rules at ``arch``: the baseline every tuning run measures beside the
    policy's configs. ``arch`` is the CUDA arch the rules schedule for ("sm_90": Dlight's Matmul
    rule uses tensor cores; "sm_90a": it does not); the kernel is built for the tuning target."""

    arch: str
    #: ranks it among a candidate set's configs (none of its own: unmeasured, it comes last)
    cost: float = field(default=0.0, compare=False)

    kind: ClassVar[str] = "dlight"
    is_stock: ClassVar[bool] = True

    def __post_init__(self):
        if not re.fullmatch(r"sm_\d+[a-z]?", str(self.arch)):
            raise ValueError(f"a stock Dlight schedule needs arch='sm_XY', got {self.arch!r}")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "arch": self.arch, "cost": self.cost}

    def __repr__(self) -> str:
        return f"Config[dlight]({self.arch})"


@dataclass(frozen=True)
class MetaScheduleRecord:
    """A MetaSchedule tuning record's schedule: its trace (``Trace.as_json()``, as JSON text)."""

    trace: str
    cost: float = field(default=0.0, compare=False)

    kind: ClassVar[str] = "ms_record"
    is_stock: ClassVar[bool] = False

    def __post_init__(self):
        if not isinstance(self.trace, str) or not self.trace:
            raise ValueError("a MetaSchedule record carries its trace (JSON text)")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "trace": self.trace, "cost": self.cost}

    def __repr__(self) -> str:
        return f"Config[ms_record](trace {hashlib.sha1(self.trace.encode()).hexdigest()[:8]})"


#: anything a candidate set holds: a tile config, or a schedule that carries no tiles
AnyConfig = Union[Config, StockSchedule, MetaScheduleRecord]

_RECORD_TYPES = {"dlight": StockSchedule, "ms_record": MetaScheduleRecord}


def config_from_dict(data: dict) -> AnyConfig:
    """The config a ``to_dict`` gave (stock and MetaSchedule rows as their own types, also rows
    written when they were tile configs with empty tiles). Raises ValueError on bad data."""
    if not isinstance(data, dict):
        raise ValueError(f"a config is a JSON object, got {type(data).__name__}")
    kind = data.get("kind")
    if kind in _RECORD_TYPES:
        cls = _RECORD_TYPES[kind]
        own = {f.name for f in fields(cls)}
        rest = {k: v for k, v in data.items() if k not in own and k != "kind"}
        if any(v not in ((), [], {}, "", 0, 1, 0.0, False, "m", None) for v in rest.values()):
            raise ValueError(f"a {kind!r} config carries no tiles, got {sorted(rest)}")
        return cls(**{k: v for k, v in data.items() if k in own})
    return Config.from_dict(data)
