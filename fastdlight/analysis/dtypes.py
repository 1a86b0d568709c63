"""The dtypes fastdlight's operators and templates handle: bytes per element (one table that the
CUDA-core, mma.sync and wgmma code, the built-in operators and the command line's size checks
share), the operators' input dtypes and their default output dtype. No TVM here: the command line
reads it before TVM loads."""

NBYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "int32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1}
#: 8-bit floats (Hopper's wgmma multiplies them with fp32 sums)
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")

#: the input dtypes of the built-in operators (``fastdlight.ops``; matmul also takes FP8_DTYPES)
OP_DTYPES = ("float16", "bfloat16", "float32", "int8", "int32")


def default_out_dtype(dtype: str) -> str:
    """What a built-in operator writes when no output dtype is given."""
    return {"int8": "int32", "float16": "float16", "bfloat16": "float32", "float8_e4m3fn": "float16",
            "float8_e5m2": "float16"}.get(dtype, dtype)
