"""Bytes per element of the dtypes the tensor-core policies and templates handle (one table that
the CUDA-core, mma.sync and wgmma code share)."""

NBYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "int32": 4}
