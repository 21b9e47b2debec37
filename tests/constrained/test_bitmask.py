"""The per-step mask layouts (packed bitmask, id lists) against the bool masks, state by state, and the
sampler's application of a batch GrammarMask against masking logits with those bool masks."""

from __future__ import annotations

import dataclasses
import json
from collections import deque

import pytest
import torch

from radixlm.constrained import GrammarOptions, make_backend
from radixlm.constrained import fsm as fsm_module
from radixlm.constrained.bitmask import (MaskBuilder, additive_row, allowed_list, apply_grammar_mask, num_words,
                                         pack_bool, unpack_blocked)
from radixlm.kernels.grammar_mask import apply_grammar_bitmask_reference, unpack_bitmask
from radixlm.runtime.sampling.sampler import Sampler, SamplingRow
from radixlm.sampling_params import SamplingParams

CPU = torch.device("cpu")
SPECS = [
    ("regex", "(a|ab|abc)(x|xy)?"),
    ("regex", "[a-c]+[0-9]{0,3}"),
    ("json_schema", json.dumps({"type": "object", "properties": {"name": {"type": "string", "maxLength": 4},
                                                                  "n": {"type": "integer"}},
                                "required": ["name", "n"]})),
    ("choices", json.dumps(["yes", "no", "maybe"])),
]


def _states(fsm) -> list[int]:
    """Every state reachable from the start over real tokens (BFS)."""
    seen, queue = {fsm.initial_state}, deque([fsm.initial_state])
    while queue:
        state = queue.popleft()
        for token in fsm.info(state).allowed_ids.tolist():
            nxt = fsm.next_state(state, token)
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return sorted(seen)


def _bool_mask(fsm, state: int, width: int) -> torch.Tensor:
    mask = torch.ones(width, dtype=torch.bool)
    fsm.fill_mask(state, mask)
    return mask


def _cpu_as_bool(plan, width: int) -> torch.Tensor:
    if plan.ids is not None:
        mask = torch.zeros(width, dtype=torch.bool)
        mask[plan.ids[plan.ids < width]] = True
        return mask
    assert plan.additive.dtype == torch.float32 and set(plan.additive.unique().tolist()) <= {0.0, float("-inf")}
    mask = torch.zeros(width, dtype=torch.bool)
    n = min(width, plan.end)
    mask[:n] = plan.additive[:n] == 0
    return mask


def _tokenizers(byte_tokenizer, sp_tokenizer):
    # Model vocab sizes: larger than the tokenizer (padding ids, never allowed), some not a multiple of
    # 32, one a multiple of 32 (no partial last word).
    n_byte, n_sp = len(byte_tokenizer), len(sp_tokenizer)
    return [(byte_tokenizer, n_byte + 16), (byte_tokenizer, -(-(n_byte + 1) // 32) * 32),
            (sp_tokenizer, n_sp + 5), (sp_tokenizer, n_sp)]


@pytest.mark.parametrize("max_list", [512, 3])  # 3: most masks become additive rows
@pytest.mark.parametrize("case", range(4))
def test_packed_and_cpu_masks_equal_the_bool_mask_in_every_state(byte_tokenizer, sp_tokenizer, case, max_list,
                                                                 monkeypatch):
    monkeypatch.setattr(fsm_module, "MAX_LIST_IDS", max_list)
    tokenizer, vocab = _tokenizers(byte_tokenizer, sp_tokenizer)[case]
    backend = make_backend("outlines", tokenizer, vocab, GrammarOptions())
    checked = 0
    for kind, spec in SPECS:
        fsm = backend.compile(kind, spec).fsm
        for state in _states(fsm):
            want = _bool_mask(fsm, state, vocab)
            assert not want[len(tokenizer):].any()  # padding never allowed
            words = torch.full((num_words(vocab),), -1, dtype=torch.int32)  # every word must be written
            fsm.fill_bitmask(state, words)
            assert torch.equal(unpack_bitmask(words.unsqueeze(0), vocab)[0], want), (spec, state)
            tail = num_words(vocab) * 32 - vocab  # bits past the vocabulary stay clear
            assert tail == 0 or int(words[-1]) >> (32 - tail) in (0, -1) and not unpack_bitmask(
                words.unsqueeze(0), num_words(vocab) * 32)[0, vocab:].any()
            assert torch.equal(_cpu_as_bool(fsm.mask_row(state).cpu, vocab), want), (spec, state)
            checked += 1
    assert checked > 30
    stats = fsm.mask_table_stats()
    assert 0 < stats["rows"] <= stats["states"]  # masks are shared between states


def test_packed_rows_are_deduplicated_and_budgeted(byte_tokenizer, model_vocab_size, monkeypatch):
    backend = make_backend("outlines", byte_tokenizer, model_vocab_size, GrammarOptions())
    schema = json.dumps({"type": "string", "maxLength": 12})
    fsm = backend.compile("json_schema", schema).fsm
    states = _states(fsm)
    for state in states:
        fsm.mask_row(state)
    stats = fsm.mask_table_stats()
    assert stats["states"] == len(states) and stats["rows"] < len(states) - 5  # the string states share one
    monkeypatch.setattr(fsm_module, "PACKED_BUDGET_BYTES", 0)
    tight = backend.compile("json_schema", schema).fsm
    for state in states:
        words = torch.zeros(num_words(model_vocab_size), dtype=torch.int32)
        tight.fill_bitmask(state, words)
        want = _bool_mask(tight, state, model_vocab_size)
        assert torch.equal(unpack_bitmask(words.unsqueeze(0), model_vocab_size)[0], want)
        cpu = tight.mask_row(state).cpu  # over budget: a list when it is short, else the bits
        assert cpu is None if len(want.nonzero()) > fsm_module.MAX_LIST_IDS else torch.equal(
            _cpu_as_bool(cpu, model_vocab_size), want)
    assert tight.mask_table_stats() == {"states": 0, "rows": 0, "bytes": 0}  # nothing cached past the cap


def test_matcher_after_eos_allows_only_eos(backends, byte_tokenizer, model_vocab_size):
    eos = byte_tokenizer.eos_token_id
    matcher = backends["default"].compile("regex", "ab").matcher()
    for ch in "ab":
        assert matcher.accept_token(byte_tokenizer.convert_tokens_to_ids(ch))
    assert matcher.accept_token(eos)
    words = torch.full((num_words(model_vocab_size),), -1, dtype=torch.int32)
    matcher.fill_bitmask(words)
    assert unpack_bitmask(words.unsqueeze(0), model_vocab_size)[0].nonzero().flatten().tolist() == [eos]
    assert matcher.cpu_mask().ids.tolist() == [eos]


def test_pack_bool_layout_matches_the_kernel_reference():
    for width in (1, 31, 32, 33, 70, 96):
        mask = torch.rand(width, generator=torch.Generator().manual_seed(width)) < 0.5
        mask[-1] = True  # the top bit of a word is the int32 sign bit
        words = pack_bool(mask)
        assert words.shape == (num_words(width),) and words.dtype == torch.int32
        assert torch.equal(unpack_bitmask(words.unsqueeze(0), width)[0], mask)
        assert torch.equal(unpack_blocked(words.unsqueeze(0), width)[0], ~mask)


class _Fixed:
    """A matcher stand-in with a fixed mask; `layout` is the CPU layout it offers: "ids", "add" or None."""

    def __init__(self, allowed: torch.Tensor, layout: str | None):
        self.allowed, self.layout = allowed, layout

    def fill_bitmask(self, words: torch.Tensor) -> None:
        padded = torch.zeros(words.shape[0] * 32, dtype=torch.bool)
        padded[: len(self.allowed)] = self.allowed
        words.copy_(pack_bool(padded))

    def cpu_mask(self):
        ids = self.allowed.nonzero().flatten()
        if self.layout == "ids":
            return allowed_list(ids)
        return additive_row(ids, len(self.allowed) - 3) if self.layout == "add" else None


def _masks(width: int, limit: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    few = torch.zeros(width, dtype=torch.bool)
    few[torch.randint(0, limit, (5,), generator=gen)] = True
    most = torch.rand(width, generator=gen) < 0.9
    most[limit:] = False
    return [few, most, torch.zeros(width, dtype=torch.bool)]


@pytest.mark.parametrize("width", [70, 96])
@pytest.mark.parametrize("with_processed", [False, True])
def test_apply_grammar_mask_equals_bool_masking(width, with_processed):
    limit = width - 6  # ids >= limit are model padding
    few, most, _ = _masks(width, limit, seed=width)
    matchers = [None, _Fixed(few, "ids"), _Fixed(most, "add"), _Fixed(most, None), _Fixed(few, None),
                _Fixed(most, "ids")]
    logits = torch.randn(len(matchers), width, generator=torch.Generator().manual_seed(1))
    builder = MaskBuilder()
    for layouts in (True, False):
        mask = builder.build(matchers, width, CPU, cpu_layouts=layouts)
        if layouts:
            assert sorted(mask.cpu) == [1, 2, 5] and mask.bit_rows == [3, 4]
        processed = logits.clone() if with_processed else None
        before = logits.clone()
        got = apply_grammar_mask(logits, processed, mask)
        assert torch.equal(logits, before)  # the sampler's logits are never written
        for i, m in enumerate(matchers):
            want = logits[i] if m is None else logits[i].masked_fill(~m.allowed, float("-inf"))
            assert torch.equal(got[i], want), (layouts, i)
        if with_processed:
            assert got.data_ptr() == processed.data_ptr()


def test_scratch_buffer_is_reset_between_steps():
    """Consecutive steps with different masks and layouts on the reused buffer: no stale entries."""
    width, limit = 96, 90
    builder = MaskBuilder()
    for step in range(6):
        few = _masks(width, limit, seed=step)[0]
        # row 0 always an id list; row 1 alternates with layouts written whole (additive, bits)
        other = _masks(width, limit, seed=100 + step)[step % 2]
        matchers = [_Fixed(few, "ids"), _Fixed(other, ["ids", "add", "ids", None][step % 4])]
        logits = torch.randn(2, width, generator=torch.Generator().manual_seed(step))
        mask = builder.build(matchers, width, CPU)
        got = apply_grammar_mask(logits, None, mask)
        fresh = apply_grammar_mask(logits, None, dataclasses.replace(mask, scratch=None))  # a new tensor
        for i, m in enumerate(matchers):
            assert torch.equal(got[i], logits[i].masked_fill(~m.allowed, float("-inf"))), step
        assert torch.equal(fresh, got) and fresh.data_ptr() != got.data_ptr()


def test_narrower_logits_cut_the_mask(byte_tokenizer, model_vocab_size):
    """The sampler's row may be narrower than the grammar's vocabulary: ids past it are ignored."""
    backend = make_backend("outlines", byte_tokenizer, model_vocab_size, GrammarOptions())
    matcher = backend.compile("regex", "[a-z]+").matcher()
    width = byte_tokenizer.convert_tokens_to_ids("m")  # a..l fit, m..z are cut off
    logits = torch.randn(1, width)
    for layouts in (True, False):
        got = apply_grammar_mask(logits, None, MaskBuilder().build([matcher], width, CPU, cpu_layouts=layouts))
        kept = torch.isfinite(got[0]).nonzero().flatten().tolist()
        assert kept == sorted(byte_tokenizer.convert_tokens_to_ids(c) for c in "abcdefghijkl")


def test_sampler_with_grammar_mask(backends, byte_tokenizer, model_vocab_size):
    """Greedy takes the best allowed token, sampling stays inside the mask, a dead row gets EOS."""
    eos = byte_tokenizer.eos_token_id
    sampler = Sampler(model_vocab_size, frozenset({eos}))
    digits = backends["default"].compile("regex", "[0-9]+").matcher()
    bool_mask = torch.zeros(model_vocab_size, dtype=torch.bool)
    digits.fill_allowed_mask(bool_mask)
    allowed = set(bool_mask.nonzero().flatten().tolist())
    assert {byte_tokenizer.convert_tokens_to_ids(c) for c in "0123456789"} <= allowed
    logits = torch.randn(1, model_vocab_size, generator=torch.Generator().manual_seed(3)).expand(300, -1)
    rows = [SamplingRow(SamplingParams(temperature=0.0 if i == 0 else 1.0), [1], [], None) for i in range(300)]
    torch.manual_seed(0)
    out = sampler(logits, rows, MaskBuilder().build([digits] * 300, model_vocab_size, CPU))
    assert out.token_ids[0] == max(allowed, key=lambda t: float(logits[0, t]))
    assert set(out.token_ids) <= allowed and len(set(out.token_ids)) > 3
    nothing = _Fixed(torch.zeros(model_vocab_size, dtype=torch.bool), None)
    dead = sampler(logits[:2], [rows[0], rows[0]], MaskBuilder().build([nothing, None], model_vocab_size, CPU))
    assert dead.token_ids[0] == eos and dead.token_ids[1] == int(logits[0].argmax())


def _masked_argmax(logits: torch.Tensor, allowed: torch.Tensor) -> int:
    width = logits.shape[-1]
    return int(logits.masked_fill(~allowed[:width], float("-inf")).argmax())


@pytest.mark.parametrize("width", [70, 96])
def test_greedy_under_grammar_picks_the_masked_argmax(width, monkeypatch):
    """Greedy rows the grammar decides (id lists: argmax of the allowed entries; additive rows and bits:
    the unmasked argmax if allowed) get the masked row's argmax; refused, dead and sampled rows take the
    full mask path. Covers ties, NaN, model padding and mixes of decided and undecided rows."""
    from radixlm.constrained import bitmask

    calls = []
    real_apply = bitmask.apply_grammar_mask
    monkeypatch.setattr("radixlm.runtime.sampling.sampler.apply_grammar_mask",
                        lambda *a: calls.append(a[2]) or real_apply(*a))
    limit = width - 6
    sampler = Sampler(limit, frozenset({0}))
    builder = MaskBuilder()
    gen = torch.Generator().manual_seed(width)
    for step in range(40):
        few, most, nothing = _masks(width, limit, seed=step)
        logits = torch.randn(6, width, generator=gen)
        logits[:, 7] = logits[:, 3] = logits.amax(dim=-1) + 1  # a tie at the top: the first one wins
        layouts = [["ids", "add", None][(step + k) % 3] for k in range(6)]
        allowed = [few, most, most.clone(), few, nothing if step % 4 == 0 else most, most]
        if step % 5 == 0:  # a NaN logit at an allowed token (a broken model): it counts as the maximum
            logits[2, 11], allowed[2][11] = float("nan"), True
        if step % 2:
            allowed[1] = allowed[1].clone()
            allowed[1][3] = True  # the unmasked argmax is allowed: decided without the full mask
        matchers = [_Fixed(a, layout) for a, layout in zip(allowed, layouts)]
        greedy = SamplingParams(temperature=0.0, repetition_penalty=1.3 if step % 3 == 0 else 1.0)
        rows = [SamplingRow(greedy, [5, 9], [3], None) for _ in range(5)]
        rows.append(SamplingRow(SamplingParams(temperature=1.0), [1], [], None))  # sampled
        for batch in (slice(0, 1), slice(0, 5), slice(0, 6)):
            calls.clear()
            got = sampler(logits[batch], rows[batch], builder.build(matchers[batch], width, CPU)).token_ids
            processed = sampler.processed_logits(logits[batch], rows[batch])
            for i, token in enumerate(got):
                if i < 5:
                    want = _masked_argmax(processed[i], allowed[i]) if bool(allowed[i][:limit].any()) else 0
                    if step % 5 == 0 and i == 2:
                        want = 11
                    assert token == want, (step, i, layouts[i])
                else:
                    assert bool(allowed[i][token]), step
            if batch.stop == 1 and layouts[0] == "ids":
                assert calls == []  # decided from its id list: no row was masked


@pytest.mark.parametrize("layout", ["ids", "add"])
def test_sampled_rows_under_a_grammar_follow_the_masked_distribution(layout):
    """Sampled rows with an id-list mask draw from their allowed logits alone; the full-row path (additive
    row) and it must both give the masked, temperature-scaled, top-p-filtered distribution."""
    width, n = 96, 4000
    allowed = torch.zeros(width, dtype=torch.bool)
    ids = [4, 17, 30, 55, 71, 90]
    allowed[ids] = True
    logits = torch.randn(1, width, generator=torch.Generator().manual_seed(5)) + 3.0  # blocked tokens likely
    logits[0, ids] = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, -3.0])
    params = SamplingParams(temperature=0.8, top_p=0.9)
    probs = torch.softmax(logits[0, ids] / 0.8, dim=-1)
    keep = (torch.cumsum(probs, 0) - probs) < 0.9  # top-p: the smallest head reaching 0.9
    expected = torch.where(keep, probs, 0.0) / probs[keep].sum()
    torch.manual_seed(0)
    rows = [SamplingRow(params, [1], [], None, wants_logprob=False)] * n
    mask = MaskBuilder().build([_Fixed(allowed, layout)] * n, width, CPU)
    out = Sampler(width, frozenset({0}))(logits.expand(n, -1), rows, mask).token_ids
    counts = torch.tensor([out.count(t) for t in ids], dtype=torch.float32)
    assert sum(counts) == n  # nothing outside the mask
    torch.testing.assert_close(counts / n, expected, atol=0.025, rtol=0)


def test_a_seeded_row_settled_by_its_allowed_list_ignores_its_batch():
    """A seeded sampled row drawn from its allowed list gives the same tokens alone and next to rows that
    take the full path (its generator advances once a step either way)."""
    from radixlm.runtime.sampling.sampler import make_generator

    width = 96
    few, most, _ = _masks(width, width - 6, seed=3)
    sampler, gen = Sampler(width, frozenset({0})), torch.Generator().manual_seed(4)
    lone = SamplingRow(SamplingParams(temperature=1.0, sampling_seed=11), [1], [], make_generator(11))
    batched = SamplingRow(SamplingParams(temperature=1.0, sampling_seed=11), [1], [], make_generator(11))
    others = [SamplingRow(SamplingParams(temperature=0.7, sampling_seed=5), [1], [], make_generator(5)),
              SamplingRow(SamplingParams(temperature=0.0), [1], [], None)]
    blocked_top = most.clone()
    for _ in range(12):
        logits = torch.randn(3, width, generator=gen) * 3
        blocked_top[int(logits[2].argmax())] = False  # the greedy row's argmax is refused: full mask
        mask = MaskBuilder().build([_Fixed(few, "ids"), None, _Fixed(blocked_top, "add")], width, CPU)
        both = sampler(logits, [batched, *others], mask).token_ids
        alone = sampler(logits[:1], [lone], MaskBuilder().build([_Fixed(few, "ids")], width, CPU)).token_ids
        assert both[0] == alone[0] and bool(few[both[0]])
        assert both[2] == _masked_argmax(logits[2], blocked_top)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7, top_p=0.95), SamplingParams(temperature=1.0, top_k=5),
                                    SamplingParams(temperature=0.5, min_p=0.1)])
def test_one_allowed_token_under_every_filter(params):
    """An allowed list of one token leaves the sampler a [1, 1] row: every filter must cope."""
    width = 64
    only = torch.zeros(width, dtype=torch.bool)
    only[9] = True
    logits = torch.randn(2, width, generator=torch.Generator().manual_seed(2))
    rows = [SamplingRow(params, [1], [], None)] * 2
    mask = MaskBuilder().build([_Fixed(only, "ids"), _Fixed(only, "add")], width, CPU)
    assert Sampler(width, frozenset({0}))(logits, rows, mask).token_ids == [9, 9]


def test_logprobs_only_for_rows_that_want_them():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.0)
    rows = [SamplingRow(params, [1], [], None, wants_logprob=w) for w in (False, True, False)]
    out = Sampler(50, frozenset({0}))(logits, rows)
    want = torch.log_softmax(logits, dim=-1)[1, out.token_ids[1]]
    assert out.logprobs[0] is None and out.logprobs[2] is None
    assert out.logprobs[1] == pytest.approx(float(want), abs=1e-6)
    none = Sampler(50, frozenset({0}))(logits, [rows[0]] * 3)
    assert none.logprobs == [None] * 3 and none.token_ids == logits.argmax(dim=-1).tolist()


def test_device_layout_through_the_kernel_reference(backends, byte_tokenizer, model_vocab_size):
    """What the CUDA path hands the Triton kernel (the whole batch's bitmask, unconstrained rows all
    ones) gives the same logits as the bool masks, via the kernel's torch reference."""
    json_matcher = backends["compact"].compile("json_schema", json.dumps({"type": "string"})).matcher()
    assert json_matcher.accept_token(byte_tokenizer.convert_tokens_to_ids('"'))
    matchers = [backends["default"].compile("regex", "[0-9]+").matcher(), None, json_matcher]
    mask = MaskBuilder().build(matchers, model_vocab_size, CPU, cpu_layouts=False)
    mask.bitmask[1].fill_(-1)  # what build does for unconstrained rows off the CPU
    logits = torch.randn(3, model_vocab_size)
    got = apply_grammar_bitmask_reference(logits, mask.bitmask)
    for i, matcher in enumerate(matchers):
        want = logits[i]
        if matcher is not None:
            allowed = torch.zeros(model_vocab_size, dtype=torch.bool)
            matcher.fill_allowed_mask(allowed)
            want = want.masked_fill(~allowed, float("-inf"))
        assert torch.equal(got[i], want)
