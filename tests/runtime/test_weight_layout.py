"""The CPU weight layouts (runtime/model/weight_layout.py): chosen as measured, same products, same greedy
outputs as transformers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.runtime.engine import Engine
from radixlm.runtime.model.weight_layout import (PackedRows, Tiles, as_blocks, as_tiles, block_count, blocked_linear,
                                                 column_major, pack, packed_available, packed_linear, resolve_layout,
                                                 tile_ops, tiled_linear)
from radixlm.testing import hf_greedy_ids

PROMPTS = ["Paris", "The quick brown fox jumps over the lazy dog", "1 2 3 4 5 6 7 8"]
CPU = torch.device("cpu")


def _is_column_major(w: torch.Tensor) -> bool:
    return w.t().is_contiguous() and not w.is_contiguous()


def test_column_major_keeps_values_and_shape():
    w = torch.randn(7, 5)
    c = column_major(w)
    assert c.shape == w.shape and torch.equal(c, w) and _is_column_major(c)


@pytest.mark.parametrize("rows,threads,expected", [(960, 2, 4), (576, 2, 4), (6, 2, 3), (7, 2, 1), (576, 8, 16),
                                                   (10, 1, 2), (1, 4, 1)])
def test_block_count_divides_the_rows(rows, threads, expected):
    assert block_count(rows, threads) == expected


@pytest.mark.parametrize("m", [1, 3, 32, 200])  # 200: past MAX_BLOCKED_ROWS, one GEMM
@pytest.mark.parametrize("with_bias", [False, True])
def test_blocked_linear_equals_linear(m, with_bias):
    g = torch.Generator().manual_seed(m)
    w = torch.randn(24, 10, generator=g)
    x = torch.randn(m, 10, generator=g)
    bias = torch.randn(24, generator=g) if with_bias else None
    blocks = as_blocks(w, 2)
    assert blocks.shape == (4, 6, 10) and blocks.data_ptr() == w.data_ptr()  # a view: no copy
    got = blocked_linear(x, blocks, bias)
    assert got.shape == (m, 24)
    torch.testing.assert_close(got, F.linear(x, w, bias), rtol=1e-5, atol=1e-5)
    # A strided input (a column slice, as the MLP's gate half is) and a weight with no row divisor.
    wide = torch.randn(m, 20, generator=g)[:, :10]
    torch.testing.assert_close(blocked_linear(wide, blocks), F.linear(wide, w), rtol=1e-5, atol=1e-5)
    odd = torch.randn(7, 10, generator=g)
    assert as_blocks(odd, 2) is odd
    torch.testing.assert_close(blocked_linear(x, as_blocks(odd, 2)), F.linear(x, odd))


needs_onednn = pytest.mark.skipif(not packed_available(), reason="this torch has no oneDNN prepacked linear")


@needs_onednn
@pytest.mark.parametrize("m", [1, 2, 5, 16, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_equals_linear(m, with_bias):
    g = torch.Generator().manual_seed(m)
    w, x = torch.randn(24, 10, generator=g), torch.randn(m, 10, generator=g)
    bias = torch.randn(24, generator=g) if with_bias else None
    packed = pack(w)
    assert packed.is_mkldnn and packed.shape == w.shape and torch.equal(packed.to_dense(), w)
    torch.testing.assert_close(packed_linear(x, packed, bias), F.linear(x, w, bias), rtol=1e-5, atol=1e-5)
    wide = torch.randn(m, 20, generator=g)[:, :10]  # a strided input (a column slice)
    torch.testing.assert_close(packed_linear(wide, packed), F.linear(wide, w), rtol=1e-5, atol=1e-5)
    assert torch.equal(packed_linear(x, w), F.linear(x, w))  # a plain weight (an unpacked part): F.linear
    both = PackedRows(packed, as_blocks(w, 2))  # packed_blocks: one row through the blocks, more packed
    want = blocked_linear(x, both.rows, bias) if m == 1 else packed_linear(x, packed, bias)
    assert torch.equal(packed_linear(x, both, bias), want)
    ops = tile_ops()
    if ops is not None:  # packed_tiles: up to a tile's rows through the compiled GEMV, more packed
        tiled = PackedRows(packed, as_tiles(w, ops))
        assert tiled.rows.max_rows == ops.tile_rows() >= 2
        want = tiled_linear(x, tiled.rows, bias) if m <= ops.tile_rows() else packed_linear(x, packed, bias)
        assert torch.equal(packed_linear(x, tiled, bias), want)
        torch.testing.assert_close(tiled_linear(x, tiled.rows, bias), F.linear(x, w, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(tile_ops() is None, reason="the compiled CPU ops did not build")
def test_a_few_rows_keep_their_one_row_bits_in_packed_tiles():
    """A step of up to a tile's rows (two requests decoding, one short verify row) goes through the tiled GEMV:
    each row's output has the bits it has alone, and past a tile's rows the step is oneDNN's."""
    ops = tile_ops()
    g = torch.Generator().manual_seed(7)
    w, bias = torch.randn(40, 96, generator=g), torch.randn(40, generator=g)
    tiled = PackedRows(pack(w), as_tiles(w, ops))
    few = torch.randn(ops.tile_rows(), 96, generator=g)
    both = packed_linear(few, tiled, bias)
    for i in range(few.shape[0]):
        assert torch.equal(both[i: i + 1], packed_linear(few[i: i + 1], tiled, bias))
    many = torch.randn(ops.tile_rows() + 1, 96, generator=g)
    assert torch.equal(packed_linear(many, tiled, bias), packed_linear(many, tiled.packed, bias))
    torch.testing.assert_close(both, F.linear(few, w, bias), rtol=1e-5, atol=1e-5)


def test_resolve_layout():
    assert resolve_layout("auto", CPU, torch.float32, 2) == "blocks"
    assert resolve_layout("auto", CPU, torch.float32, 1) == "column"
    assert resolve_layout("column", CPU, torch.float32, 4) == "column"
    assert resolve_layout("packed", CPU, torch.float32, 2) == ("packed" if packed_available() else "blocks")
    assert resolve_layout("blocks", CPU, torch.bfloat16, 4) == "row"  # measured for fp32 only
    assert resolve_layout("auto", torch.device("cuda"), torch.float32, 2) == "row"
    with pytest.raises(ValueError, match="weight_layout"):
        resolve_layout("columns", CPU, torch.float32, 2)


@pytest.mark.parametrize("layout,threads", [("auto", 2), ("auto", 1), ("row", 2), ("column", 2), ("blocks", 1),
                                            pytest.param("packed", 2, marks=needs_onednn),
                                            pytest.param("packed", 1, marks=needs_onednn),
                                            pytest.param("packed_blocks", 2, marks=needs_onednn),
                                            pytest.param("packed_blocks", 1, marks=needs_onednn),
                                            pytest.param("packed_tiles", 2, marks=needs_onednn)])
def test_layouts_give_transformers_greedy_outputs(tiny_llama_dir, layout, threads):
    with Engine(str(tiny_llama_dir), weight_layout=layout, num_threads=threads) as engine:
        model = engine.runner.model
        layer = model.layers[0]
        chosen = resolve_layout(layout, CPU, torch.float32, threads)
        assert engine.runner.layout == chosen
        if chosen == "blocks":
            assert layer.self_attn.qkv_weight.dim() == 3 and layer.down_weight.dim() == 3
            assert layer.linear is blocked_linear and model.linear is blocked_linear
            assert model.lm_head_matmul is not None and model.lm_head_single_row is None
        elif chosen == "packed_blocks":  # packed, and the blocks view for one-row steps
            for w in (layer.self_attn.qkv_weight, layer.down_weight):
                assert isinstance(w, PackedRows) and w.packed.is_mkldnn and w.rows.dim() == 3
            assert layer.linear is packed_linear and isinstance(model.lm_head_matmul, PackedRows)
        elif chosen == "packed_tiles":  # packed, and the compiled GEMV's tiled copy for one-row steps
            for w in (layer.self_attn.qkv_weight, layer.down_weight, model.lm_head_matmul):
                assert isinstance(w, PackedRows) and w.packed.is_mkldnn and isinstance(w.rows, Tiles)
            assert layer.linear is packed_linear and engine.runner.threads.small == threads
        elif chosen == "packed":
            assert layer.self_attn.qkv_weight.is_mkldnn and layer.down_weight.is_mkldnn
            assert layer.linear is packed_linear and model.linear is packed_linear
            assert model.lm_head_matmul.is_mkldnn and model.lm_head_single_row is None
            assert engine.runner.threads.small == threads  # oneDNN threads every step
        elif chosen == "column":
            assert _is_column_major(layer.self_attn.qkv_weight) and _is_column_major(layer.gate_up_weight)
            assert layer.down_weight.is_contiguous()  # measured faster row-major
            assert model.lm_head_single_row is not None and _is_column_major(model.lm_head_single_row)
        else:
            assert layer.self_attn.qkv_weight.is_contiguous() and layer.self_attn.qkv_weight.dim() == 2
            assert model.lm_head_single_row is None and model.lm_head_matmul is None
        # One prompt alone (single-row LM head) and several together.
        single = engine.generate(PROMPTS[0], {"max_new_tokens": 8, "temperature": 0})["output_ids"]
        many = [r["output_ids"] for r in engine.generate(PROMPTS, {"max_new_tokens": 8, "temperature": 0})]
        engine.check_integrity()
    expected = hf_greedy_ids(tiny_llama_dir, PROMPTS, 8)
    assert many == expected and single == expected[0]


def test_layout_is_only_for_fp32_cpu(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), dtype="bfloat16") as engine:
        assert engine.runner.layout == "row"
        assert engine.runner.model.layers[0].gate_up_weight.is_contiguous()
        assert engine.runner.model.lm_head_single_row is None and engine.runner.model.lm_head_matmul is None
    with pytest.raises(ValueError, match="weight_layout"):
        Engine(str(tiny_llama_dir), weight_layout="columns")
