"""The dtypes fastdlight's operators and templates handle: bytes per element (one table that the
CUDA-core, mma.sync and wgmma code, the built-in operators and the command line's size checks
share), the operators' input dtypes and their default output dtype. No TVM here: the command line
reads it before TVM loads."""

NBYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "int32": 4}

#: the input dtypes of the built-in operators (``fastdlight.ops``)
OP_DTYPES = tuple(NBYTES)


def default_out_dtype(dtype: str) -> str:
    """What a built-in operator writes when no output dtype is given."""
    return {"int8": "int32", "float16": "float16", "bfloat16": "float32"}.get(dtype, dtype)
