"""Streamed updates cross the detokenizer -> HTTP-process wire as deltas; the tokenizer manager's
StreamAssembler rebuilds exactly the cumulative native shape a ResponseState produces, rollbacks included,
and the bytes per update do not grow with the output."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from radixlm.runtime.detokenizer import Detokenizer
from radixlm.runtime.generate_input import InputLimits, prepare_generate
from radixlm.runtime.messages import BatchTokenOut, FinishReason, GenerateReq, TokenOut, encode
from radixlm.runtime.response import ResponseState
from radixlm.runtime.server.stream_assembly import StreamAssembler


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    return AutoTokenizer.from_pretrained(str(tiny_llama_dir))


def _prepared(tokenizer, stop: list[str], max_new_tokens: int = 600):
    (p,), _ = prepare_generate(tokenizer, InputLimits(384, 2048, 1 << 16), text="The quick", stream=True, rid="r",
                               sampling_params={"max_new_tokens": max_new_tokens, "stop": stop},
                               return_logprob=True)
    return p


def _token_outs(tokenizer, count: int) -> list[TokenOut]:
    """One new word piece per update; twice, jump-forward re-tokenizes the tail (the text it covers stays)."""
    words = [i for i in tokenizer("brown fox jumps over the lazy dog").input_ids if i not in tokenizer.all_special_ids]
    sent: list[int] = []
    outs = []
    for t in range(count):
        word = words[t % len(words)]
        rollback = 2 if t in (7, 30) else 0
        new = [*sent[len(sent) - rollback:], word] if rollback else [word]
        sent = [*sent[: len(sent) - rollback], *new]
        outs.append(TokenOut("r", new, 2, len(sent), 0, num_rollback=rollback, output_logprobs=[(-0.5, word)]))
    return outs


@pytest.mark.parametrize("stop", [[], ["lazy d"]])
def test_assembled_stream_equals_the_cumulative_response(tokenizer, stop):
    p = _prepared(tokenizer, stop)
    detok, assembler = Detokenizer(tokenizer), StreamAssembler()
    detok.handle(GenerateReq(p.msg, ["r"], p.return_text_in_logprobs))
    reference = ResponseState("r", p, tokenizer)  # what every update carried before deltas
    for out in _token_outs(tokenizer, 60):
        reference.update(out)
        (str_out,) = detok.handle(BatchTokenOut([out])).outputs
        assert str_out.delta and not str_out.finished
        got = assembler.assemble(str_out)
        want = reference.to_dict(streaming=True)
        got["meta_info"].pop("e2e_latency"), want["meta_info"].pop("e2e_latency")
        assert got == want
    final = TokenOut("r", [], 2, 60, 0, FinishReason("length", length=60))
    reference.update(final)
    (last,) = detok.handle(BatchTokenOut([final])).outputs
    assert last.finished and not last.delta and assembler.assemble(last)["text"] == reference.text
    assert len(assembler) == 0 and detok.states == {} and detok.sent_chars == {}


def test_bytes_per_update_do_not_grow_with_the_output(tokenizer):
    p = _prepared(tokenizer, [])
    detok = Detokenizer(tokenizer)
    detok.handle(GenerateReq(p.msg, ["r"], False))
    sizes = [len(encode(detok.handle(BatchTokenOut([TokenOut("r", [40 + t % 20], 2, t + 1, 0)]))))
             for t in range(500)]
    assert max(sizes[400:]) <= max(sizes[:10]) + 8  # a few bytes of counter width, never the whole output
