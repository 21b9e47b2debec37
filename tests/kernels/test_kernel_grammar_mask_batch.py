"""The scheduler's packed grammar masks (MaskBuilder's batch buffer) through the Triton kernel: the same
logits as masking with the matchers' bool masks. CUDA: the sampler's whole device path (pinned buffer,
copy, kernel); CPU: the kernel under Triton's interpreter on the same buffer."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("outlines_core")  # the grammar backend the builder compiles with (absent on a bare GPU machine)

from radixlm.constrained import GrammarOptions, make_backend  # noqa: E402
from radixlm.constrained.bitmask import MaskBuilder, _apply_bits_device, apply_grammar_mask  # noqa: E402


def test_builder_bitmask_through_the_kernel(device, tmp_path):
    from radixlm.testing import build_tokenizer

    tokenizer = build_tokenizer(tmp_path)
    vocab = len(tokenizer) + 13  # padding, and not a multiple of 32
    backend = make_backend("outlines", tokenizer, vocab, GrammarOptions())
    in_string = backend.compile("json_schema", json.dumps({"type": "string"})).matcher()
    assert in_string.accept_token(tokenizer.convert_tokens_to_ids('"'))
    matchers = [backend.compile("regex", "[0-9]+").matcher(), None, in_string]
    logits = torch.randn(3, vocab + 3)[:, :vocab]  # a view of wider rows, as the sampler's vocab view
    want = logits.clone()
    for i, matcher in enumerate(matchers):
        if matcher is not None:
            allowed = torch.zeros(vocab, dtype=torch.bool)
            matcher.fill_allowed_mask(allowed)
            want[i] = want[i].masked_fill(~allowed, float("-inf"))
    if device.type == "cuda":
        mask = MaskBuilder().build(matchers, vocab, device)
        assert mask.bitmask.is_pinned() and not mask.cpu
        got = apply_grammar_mask(logits.to(device), None, mask).cpu()
    else:
        mask = MaskBuilder().build(matchers, vocab, device, cpu_layouts=False)
        mask.bitmask[1].fill_(-1)  # what build does for unconstrained rows on an accelerator
        got = _apply_bits_device(logits.clone(), mask)
    assert torch.equal(got, want)
