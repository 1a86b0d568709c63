"""Hardware model: what a policy needs to know about the GPU it tunes for."""

from .cuda import CUDA, auto_arch, has_gpu

__all__ = ["CUDA", "auto_arch", "has_gpu"]
