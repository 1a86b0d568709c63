"""The Relax side: ``ApplyFastTuning`` (every PrimFunc of a model tuned in seconds) and the one
pipeline around it (:mod:`fastdlight.relax.pipeline`) in which the tuned kernels are what runs."""

from fastdlight.relax.apply_fast_tuning import ApplyFastTuning, FunctionReport
from fastdlight.relax.pipeline import build, compile_model, for_inference, lowering, prepare, tuning_pipeline
from fastdlight.relax.quantize import quantize_weights

__all__ = ["ApplyFastTuning", "FunctionReport", "build", "compile_model", "for_inference", "lowering", "prepare", "quantize_weights",
           "tuning_pipeline"]
