"""Hardware model: what a policy needs to know about the GPU it tunes for."""

from fastdlight.arch.cuda import CUDA, auto_arch, has_gpu

__all__ = ["CUDA", "auto_arch", "has_gpu"]
