"""The compiled decode-step ops (csrc/attention.cpp, csrc/activation.cpp) against their torch references
(radixlm/kernels/cpu/reference.py), in the native and the AVX2 builds, and their batch invariance."""

from __future__ import annotations

import shutil

import pytest
import torch

from radixlm.kernels.cpu import reference

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: the ops fall back to torch")


def _rope(t: int, d: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.rand(t, 1, d // 2, generator=g) * 100
    emb = torch.cat((angles, angles), dim=-1)
    sin = emb.sin()
    return emb.cos(), torch.cat((-sin[..., : d // 2], sin[..., d // 2 :]), dim=-1)


@pytest.mark.parametrize("t", [1, 7])
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (4, 4, 32), (2, 1, 6)])
def test_rope_store_kv_is_bit_identical_to_torch(ops, t: int, hq: int, hkv: int, d: int) -> None:
    """The same fp32 products and sums as layers/rotary.py, so the stored K/V and q are bit-identical."""
    g = torch.Generator().manual_seed(t * hq + d)
    qkv, (cos, ssin) = torch.randn(t, (hq + 2 * hkv) * d, generator=g), _rope(t, d, g)
    loc = torch.randperm(40, generator=g)[:t] + 1
    bufs = [torch.zeros(41, hkv, d) for _ in range(4)]
    want = reference.rope_store_kv(qkv, cos, ssin, bufs[0], bufs[1], loc, hq, hkv)
    got = ops.rope_store_kv(qkv, cos, ssin, bufs[2], bufs[3], loc, hq, hkv)
    assert torch.equal(got, want) and torch.equal(bufs[2], bufs[0]) and torch.equal(bufs[3], bufs[1])


def _pool(rows: int, hkv: int, d: int, lens: list[int], g: torch.Generator):
    """A pool whose rows hold scattered, non-ascending slots (as after radix-cache hits)."""
    slots = 1 + sum(lens)
    k, v = torch.randn(slots, hkv, d, generator=g), torch.randn(slots, hkv, d, generator=g)
    req_to_token = torch.zeros(rows + 2, max(lens) + 5, dtype=torch.int64)
    perm = torch.randperm(slots - 1, generator=g) + 1
    req_rows = torch.randperm(rows + 2, generator=g)[:rows]
    at = 0
    for r, n in enumerate(lens):
        req_to_token[req_rows[r], :n] = perm[at : at + n]
        at += n
    return k, v, req_to_token, req_rows, torch.tensor(lens)


@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (4, 4, 32), (6, 2, 20)])
@pytest.mark.parametrize("lens", [[1], [37], [300], [5, 129, 2, 64]])
def test_paged_decode_attention_matches_sdpa(ops, hq: int, hkv: int, d: int, lens: list[int]) -> None:
    g = torch.Generator().manual_seed(len(lens) * 100 + hq + d)
    k, v, req_to_token, req_rows, seq_lens = _pool(len(lens), hkv, d, lens, g)
    q = torch.randn(len(lens), hq, d, generator=g) * 2
    want = reference.paged_decode_attention(q, k, v, req_to_token, req_rows, seq_lens, d**-0.5)
    got = ops.paged_decode_attention(q, k, v, req_to_token, req_rows, seq_lens, d**-0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_paged_decode_rows_do_not_depend_on_the_batch(ops) -> None:
    g = torch.Generator().manual_seed(3)
    lens = [17, 250, 3, 90, 64]
    k, v, req_to_token, req_rows, seq_lens = _pool(len(lens), 3, 64, lens, g)
    q = torch.randn(len(lens), 9, 64, generator=g)
    together = ops.paged_decode_attention(q, k, v, req_to_token, req_rows, seq_lens, 0.125)
    for r in range(len(lens)):
        alone = ops.paged_decode_attention(q[r : r + 1].clone(), k, v, req_to_token, req_rows[r : r + 1].clone(),
                                           seq_lens[r : r + 1].clone(), 0.125)
        assert torch.equal(alone[0], together[r])


def test_paged_decode_rejects_slots_outside_the_pool(ops) -> None:
    k = v = torch.randn(8, 1, 4)
    table = torch.tensor([[1, 2, 99]])
    with pytest.raises(RuntimeError, match="outside the pool"):
        ops.paged_decode_attention(torch.randn(1, 1, 4), k, v, table, torch.tensor([0]), torch.tensor([3]), 0.5)


def _extend_batch(hq: int, hkv: int, d: int, prefix: list[int], new: list[int], g: torch.Generator):
    """Rows of new tokens after cached prefixes over a scattered pool, and the same tokens as decode rows
    (token j of row r: its row's first prefix + j + 1 slots)."""
    k, v, req_to_token, req_rows, _ = _pool(len(prefix), hkv, d, [p + n for p, n in zip(prefix, new)], g)
    q = torch.randn(sum(new), hq, d, generator=g) * 2
    rows = req_rows.repeat_interleave(torch.tensor(new))
    lens = torch.tensor([p + j + 1 for p, n in zip(prefix, new) for j in range(n)])
    return q, k, v, req_to_token, req_rows, torch.tensor(prefix), torch.tensor(new), rows, lens


@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (4, 4, 32), (6, 2, 20), (8, 1, 128), (16, 2, 64)])
@pytest.mark.parametrize("prefix,new", [([1], [1]), ([37], [5]), ([300, 2, 64, 9], [9, 17, 1, 4])])
def test_paged_extend_attention_is_each_token_as_a_decode_row(ops, hq, hkv, d, prefix, new) -> None:
    """Bit for bit the tokenwise decode rows (a verify token's attention does not depend on how many of its
    row's tokens are verified with it), and SDPA's causal extend attention up to rounding."""
    g = torch.Generator().manual_seed(sum(prefix) + hq + d)
    q, k, v, table, req_rows, prefix_lens, extend_lens, rows, lens = _extend_batch(hq, hkv, d, prefix, new, g)
    got = ops.paged_extend_attention(q, k, v, table, req_rows, prefix_lens, extend_lens, d**-0.5)
    assert torch.equal(got, ops.paged_decode_attention(q, k, v, table, rows, lens, d**-0.5))
    want = reference.paged_extend_attention(q, k, v, table, req_rows, prefix_lens, extend_lens, d**-0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_paged_extend_attention_rejects_bad_rows(ops) -> None:
    g = torch.Generator().manual_seed(5)
    q, k, v, table, req_rows, prefix_lens, extend_lens, *_ = _extend_batch(9, 3, 64, [10, 4], [3, 2], g)
    with pytest.raises(RuntimeError, match="q has 4 tokens, the rows 5"):
        ops.paged_extend_attention(q[:4].clone(), k, v, table, req_rows, prefix_lens, extend_lens, 0.125)
    with pytest.raises(RuntimeError, match="bad request index or length"):
        ops.paged_extend_attention(q, k, v, table, req_rows, prefix_lens, torch.tensor([3, 0]), 0.125)
    table[req_rows[1], 5] = 10**6
    with pytest.raises(RuntimeError, match="outside the pool"):
        ops.paged_extend_attention(q, k, v, table, req_rows, prefix_lens, extend_lens, 0.125)


@pytest.mark.parametrize("t,inter", [(1, 1536), (5, 37)])
def test_silu_mul_matches_torch(ops, t: int, inter: int) -> None:
    """fast_exp is ~1 ulp, not Sleef's: close to torch, not bit-identical."""
    g = torch.Generator().manual_seed(t)
    gate_up = torch.randn(t, 2 * inter, generator=g) * 6
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -88.5])  # the clamped ends of exp's range
    torch.testing.assert_close(ops.silu_mul(gate_up), reference.silu_mul(gate_up), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["blocks", "row", "f32_tiles", "int8_tiles"])
def test_decode_layer_is_the_chain_of_the_ops(ops, kind: str) -> None:
    """decode_layer == the ops called one by one with the matmul each weight layout uses at one row: bmm over
    row blocks, linear, or gemv.cpp's tiled fp32 / int8 GEMVs (packed_tiles, --quantization int8)."""
    g = torch.Generator().manual_seed(len(kind))
    hidden, inter, hq, hkv, d = 48, 80, 4, 2, 12
    w = {name: torch.randn(rows, cols, generator=g) * 0.2 for name, rows, cols in
         [("qkv", (hq + 2 * hkv) * d, hidden), ("o", hidden, hq * d), ("gate_up", 2 * inter, hidden), ("down", hidden, inter)]}
    scales = {k: v.abs().amax(1) / 127 for k, v in w.items()}
    if kind == "blocks":
        mm = {k: v.view(2, v.shape[0] // 2, v.shape[1]) for k, v in w.items()}
    elif kind == "f32_tiles":
        mm = {k: ops.pack_rows(v) for k, v in w.items()}
    elif kind == "int8_tiles":
        mm = {k: ops.pack_rows(torch.round(v / scales[k][:, None]).to(torch.int8)) for k, v in w.items()}
    else:
        mm = dict(w)
    norms = torch.randn(2, hidden, generator=g)
    bias = torch.randn((hq + 2 * hkv) * d, generator=g)
    k, v, req_to_token, req_rows, seq_lens = _pool(1, hkv, d, [9], g)
    loc = req_to_token[req_rows[0], 8:9].clone()  # the new token's slot: the last of its row
    cos, ssin = _rope(1, d, g)
    x, residual = torch.randn(1, hidden, generator=g), torch.randn(1, hidden, generator=g)

    def lin(a, name, b=None):
        if kind == "row":
            return torch.nn.functional.linear(a, w[name], b)
        if kind == "f32_tiles":
            return ops.f32_linear(a, mm[name], w[name].shape[0], b)
        if kind == "int8_tiles":
            return ops.int8_linear(a, mm[name], scales[name], b)
        y = torch.bmm(mm[name], a.t().expand(2, a.shape[1], 1)).view(1, -1)
        return y if b is None else y + b

    k2, v2, res2 = k.clone(), v.clone(), residual.clone()
    h = ops.add_rms_norm(x, res2, norms[0], 1e-6)
    q = ops.rope_store_kv(lin(h, "qkv", bias), cos, ssin, k2, v2, loc, hq, hkv)
    o = ops.paged_decode_attention(q, k2, v2, req_to_token, req_rows, seq_lens, d**-0.5)
    h2 = ops.add_rms_norm(lin(o.view(1, -1), "o"), res2, norms[1], 1e-6)
    want = lin(ops.silu_mul(lin(h2, "gate_up")), "down")
    names = ("qkv", "o", "gate_up", "down")
    tiled = [w[n].shape[0] if kind.endswith("tiles") else 0 for n in names]
    layer_scales = [scales[n] if kind == "int8_tiles" else None for n in names]
    got = ops.decode_layer(x, residual, norms[0], norms[1], 1e-6, mm["qkv"], bias, mm["o"], mm["gate_up"], mm["down"],
                           cos, ssin, k, v, loc, req_to_token, req_rows, seq_lens, hq, hkv, d**-0.5, False,
                           *layer_scales, tiled)
    assert torch.equal(got, want) and torch.equal(residual, res2) and torch.equal(k, k2) and torch.equal(v, v2)
