"""Config → schedule: pick the templates serving ``config.kind`` and apply the first that fits.

Templates register per kind (:func:`register`); the built-in memory-bound ones are registered
here, the matmul modules are imported guarded (a missing or broken module is recorded in
:data:`IMPORT_ERRORS` and only disables its own kinds). :func:`dispatch_config` tries, in order, the
templates of ``config.kind`` and then the fallback; a template returning ``None`` or raising
does not stop the others. If none produces a schedule, :class:`ScheduleError` lists each
template's reason.

:func:`default_schedule` applies TVM's stock Dlight GPU rules (the reference baseline).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import sys
from dataclasses import dataclass, field

from tvm import s_tir, tirx

from fastdlight.config import KINDS, Config
from fastdlight.schedules.base import ScheduleError, ScheduleTemplate, error_line, func_name
from fastdlight.schedules.elementwise import ElementwiseTemplate
from fastdlight.schedules.fallback import FallbackTemplate
from fastdlight.schedules.gemv import GemvTemplate
from fastdlight.schedules.ms_record import MetaScheduleRecordTemplate
from fastdlight.schedules.general_reduction import GeneralReductionTemplate
from fastdlight.schedules.reduction import ReductionTemplate
from fastdlight.schedules.stock import StockDlightTemplate
from fastdlight.schedules.transpose import TransposeTemplate

#: kind -> templates, tried in registration order
_REGISTRY: dict[str, list[ScheduleTemplate]] = {}
#: templates serving any kind (``kinds == ("*",)``), tried after the kind's own templates
_FALLBACKS: list[ScheduleTemplate] = []
#: module name -> error text, for template modules that failed to import
IMPORT_ERRORS: dict[str, str] = {}


@dataclass(frozen=True)
class ScheduleResult:
    schedule: s_tir.Schedule
    template: str  # name of the template that produced it
    failures: list[tuple[str, str]] = field(default_factory=list)  # templates tried before it

    @property
    def used_fallback(self) -> bool:
        return self.template == FallbackTemplate.name


def register(template: ScheduleTemplate, first: bool = False) -> ScheduleTemplate:
    """Make ``template`` serve its ``kinds`` (``first``: try it before those registered so far).
    Registering a second instance of the same class replaces the first."""
    targets = [_FALLBACKS] if "*" in template.kinds else [_REGISTRY.setdefault(k, []) for k in template.kinds]
    for lst in targets:
        lst[:] = [t for t in lst if type(t) is not type(template)]
        lst.insert(0, template) if first else lst.append(template)
    return template


def templates_for(kind: str, with_fallback: bool = True) -> list[ScheduleTemplate]:
    return list(_REGISTRY.get(kind, [])) + (list(_FALLBACKS) if with_fallback else [])


@functools.cache
def template_fingerprint(kind: str) -> str:
    """A short hash of the source of every module that can schedule a ``kind`` config (its
    templates, the fallback, the shared helpers in ``base``, and files a template declares in
    ``sources``): a stored config is replayed only by the code that chose it."""
    modules = {type(t).__module__ for t in templates_for(kind)} | {__name__, f"{__package__}.base"}
    files = [sys.modules[name].__file__ for name in sorted(modules)]
    files += sorted(str(p) for t in templates_for(kind) for p in getattr(t, "sources", ()))  # e.g. kernel text
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def _name(t: ScheduleTemplate) -> str:
    return getattr(t, "name", None) or type(t).__name__


def dispatch_config(func: tirx.PrimFunc, config: Config, allow_fallback: bool = True) -> ScheduleResult:
    """Apply the first template (of ``config.kind``, then the fallback) that schedules ``func``."""
    kind = getattr(config, "kind", None)
    if kind not in _REGISTRY and kind not in KINDS:
        raise ScheduleError(f"unknown config kind {kind!r}; known: {sorted(set(_REGISTRY) | set(KINDS))}")
    failures: list[tuple[str, str]] = []
    if kind not in _REGISTRY:
        mods = [m for m in IMPORT_ERRORS if kind in _MODULE_KINDS.get(m, ())]
        why = f"; module {mods[0]} failed to import: {IMPORT_ERRORS[mods[0]]}" if mods else ""
        failures.append(("<registry>", f"no template registered for kind {kind!r}{why}"))
    for template in templates_for(kind, allow_fallback and kind not in NO_FALLBACK):
        try:
            sch = template.apply_config(func, config)
        except Exception as e:  # noqa: BLE001 - one template's bug must not stop the others
            failures.append((_name(template), f"{type(e).__name__}: {error_line(e)}"))
            continue
        if sch is None:
            failures.append((_name(template), "not applicable (op family or config does not fit)"))
            continue
        return ScheduleResult(sch, _name(template), failures)
    raise ScheduleError(f"no template could schedule {func_name(func)} with {config!r}", failures)


def apply_config(func: tirx.PrimFunc, config: Config, allow_fallback: bool = True) -> s_tir.Schedule:
    """The schedule for ``func`` under ``config`` (see :func:`dispatch_config`); raises ScheduleError."""
    return dispatch_config(func, config, allow_fallback).schedule


# -- registration ----------------------------------------------------------------------------

#: optional template modules (owned by other parts of the project) and the kinds they serve
_OPTIONAL = {
    "fastdlight.schedules.matmul": ("MatmulTemplate", ("matmul",)),
    "fastdlight.schedules.matmul_tensorcore": ("TensorCoreMatmulTemplate", ("matmul_tc",)),
    "fastdlight.schedules.wgmma.template": ("WgmmaMatmulTemplate", ("matmul_wgmma",)),
    "fastdlight.schedules.wgmma.dequant": ("DequantWgmmaTemplate", ("matmul_wgmma_dequant",)),
    "fastdlight.schedules.attention.template": ("AttentionTemplate", ("attention_wgmma",)),
    "fastdlight.schedules.attention.mma_template": ("MmaAttentionTemplate", ("attention_mma",)),
    "fastdlight.schedules.gemv_dequant": ("DequantGemvTemplate", ("gemv_dequant",)),
    "fastdlight.schedules.gemv_dequant_mma": ("DequantGemvMmaTemplate", ("gemv_dequant_mma",)),
    "fastdlight.schedules.decode_attention": ("DecodeAttentionTemplate", ("decode_attention", "decode_combine")),
    "fastdlight.schedules.decode_attention_mma": ("DecodeAttentionMmaTemplate", ("decode_attention_mma",)),
}
#: kinds the fallback must not stand in for: stock Dlight is Dlight's schedule or nothing, and a
#: wgmma config that the wgmma template refuses would otherwise be built as something else, and a
#: MetaSchedule record is its own trace
NO_FALLBACK = ("dlight", "matmul_wgmma", "matmul_wgmma_dequant", "attention_wgmma", "attention_mma", "gemv_dequant",
               "gemv_dequant_mma", "decode_attention", "decode_attention_mma", "decode_combine", "ms_record")
_MODULE_KINDS = {mod: kinds for mod, (_, kinds) in _OPTIONAL.items()}


def _register_builtin() -> None:
    register(ElementwiseTemplate())
    register(TransposeTemplate())
    register(ReductionTemplate())
    register(GeneralReductionTemplate())  # serves general_reduction and reduction (epilogues)
    register(GemvTemplate())
    register(StockDlightTemplate())
    register(MetaScheduleRecordTemplate())
    register(FallbackTemplate())
    for mod_name, (cls_name, _) in _OPTIONAL.items():
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
            register(cls())
        except Exception as e:  # noqa: BLE001 - a broken optional module only disables itself
            IMPORT_ERRORS[mod_name] = f"{type(e).__name__}: {e}"


_register_builtin()
