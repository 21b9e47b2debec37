"""Apply a grammar token bitmask to logits, in place: Triton kernel, launcher, torch reference.

Runs in the scheduler process (sampler) on CUDA; tests run it under TRITON_INTERPRET=1 on CPU.
Bitmask layout (the one grammar backends such as xgrammar/outlines-core produce): int32 [B, ceil(V/32)],
bit j of word w set <=> token 32*w + j is allowed. Disallowed logits become -inf.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import LazyKernel, check_device, next_pow2, tl

_BLOCK = 4096


def _grammar_mask_body(
    logits_ptr, mask_ptr, vocab_size, stride_logits, stride_mask,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = tokens < vocab_size
    # each word is gathered 32 times; it is tiny and cached, far cheaper than a second pass
    words = tl.load(mask_ptr + row * stride_mask + tokens // 32, mask=in_vocab, other=0)
    allowed = ((words >> (tokens % 32)) & 1) != 0
    ptrs = logits_ptr + row * stride_logits + tokens
    tl.store(ptrs, tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty), mask=in_vocab & ~allowed)


_grammar_mask_kernel = LazyKernel(_grammar_mask_body)


def _check(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    assert logits.dim() == 2 and bitmask.dim() == 2 and bitmask.shape[0] == logits.shape[0], (
        logits.shape, bitmask.shape)
    assert bitmask.shape[1] == (logits.shape[1] + 31) // 32, "bitmask must have ceil(V/32) words per row"
    assert bitmask.dtype == torch.int32 and logits.dtype.is_floating_point, (bitmask.dtype, logits.dtype)
    assert logits.stride(1) == 1 and bitmask.stride(1) == 1, "last dims must be contiguous"


def apply_grammar_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set logits[b, t] = -inf where bit t of row b of the int32 bitmask [B, ceil(V/32)] is clear (in place)."""
    _check(logits, bitmask)
    check_device(logits, bitmask)
    batch, vocab = logits.shape
    if batch == 0:
        return
    block = min(_BLOCK, next_pow2(vocab))
    grid = (batch, (vocab + block - 1) // block)
    _grammar_mask_kernel[grid](logits, bitmask, vocab, logits.stride(0), bitmask.stride(0), BLOCK=block)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [B, vocab_size]: True where the token is allowed."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool()  # [B, W, 32]
    return allowed.flatten(1)[:, :vocab_size]


def apply_grammar_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Torch reference; returns a new tensor."""
    allowed = unpack_bitmask(bitmask, logits.shape[1])
    return logits.masked_fill(~allowed, float("-inf"))
