"""Operands read through views (``fastdlight.analysis.wgmma_view``): which index patterns are TMA
boxes of the source, the blocks their rows run through, and the coordinates of a tile."""

import pytest
from tvm import sym, tirx

from fastdlight.analysis.wgmma_view import ROW_BLOCKS, view_operand

I, K, B = (tirx.Var(n, "int64") for n in ("i", "k", "b"))


def view(shape, index, extents, batch=None):
    src = tirx.decl_buffer([tirx.const(x, "int64") for x in shape], "float16", "src")
    return view_operand(src, index, I, K, batch, [(I, extents[0]), (K, extents[1])] + (
        [(B, extents[2])] if batch is not None else []), 2)


def test_heads_merged_into_k_and_tokens_split_into_sequences():
    """The output projection reading attention's output [b * h, s, d] as [tokens, h * d]."""
    v, reason = view((64, 512, 128), [(I // 512) * 16 + K // 128, I % 512, K % 128], (2048, 2048))
    assert v is not None, reason
    assert v.dims == (128, 512, 64) and v.k_major and (v.row_axis, v.k_axis) == (1, 0)
    assert v.row_block == ROW_BLOCKS[0]
    # the tile at rows 1024.., K 192..: sequence 2, head 1, row 0, column 64
    coords = [sym.Analyzer().simplify(c) for c in v.coords(tirx.const(0, "int32"), tirx.const(1024, "int32"),
                                                             tirx.const(192, "int32"))]
    assert [int(c) for c in coords] == [64, 0, 2 * 16 + 1]


def test_q_as_a_column_block_of_qkv_with_the_batch_split():
    v, reason = view((2048, 6144), [(B // 16) * 512 + I, (B % 16) * 128 + K], (512, 128, 64), batch=B)
    assert v is not None, reason
    assert v.dims == (6144, 2048) and v.k_major and v.batch is B


def test_sequences_of_128_bound_the_tiles():
    v, reason = view((64, 128, 128), [(I // 128) * 16 + K // 128, I % 128, K % 128], (512, 2048))
    assert v is not None and v.row_block == 128, reason
    assert v.fits(128, 512) and not v.fits(256, 512)
    assert v.fits(256, 128)  # a single block: the rows past it are past the operand
    assert v.fits(64, 512) and not v.fits(192, 512)  # a 192-row tile would straddle two sequences


@pytest.mark.parametrize("index,why", [
    ([I, K * 2], "K does not run along one axis"),  # every other element
    ([I, K % 96], "K does not run along one axis"),  # steps of 64 cross a 96-wide block
    ([I * 2, K], "rows do not run along one axis"),
    ([I, I + K], "rows do not run along one axis"),  # rows and K along one axis
])  # fmt: skip
def test_no_box_is_refused_with_a_reason(index, why):
    v, reason = view((4096, 4096), index, (1024, 1024))
    assert v is None and why in reason


def test_neither_rows_nor_k_contiguous_is_refused():
    v, reason = view((128, 64, 64), [K, I, tirx.const(0, "int64")], (64, 128))
    assert v is None and "contiguous" in reason


def test_a_partial_k_step_only_where_the_axis_ends_at_k():
    ok, _ = view((256, 1000), [I, K], (256, 1000))
    assert ok is not None
    past, reason = view((256, 1024), [I, K], (256, 1000))  # zeros would not come past K
    assert past is None and "partial step" in reason
