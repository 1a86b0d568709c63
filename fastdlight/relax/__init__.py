"""The Relax/IRModule pass: every PrimFunc of a model tuned in seconds."""

from .apply_fast_tuning import ApplyFastTuning

__all__ = ["ApplyFastTuning"]
