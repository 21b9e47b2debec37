"""Socket-free pieces of the server pipeline: message encoding, the Detokenizer's bookkeeping, and how
the scheduler's typed errors (messages.RequestError) travel to the HTTP layer and become its errors."""

from __future__ import annotations

from typing import Union

import msgspec
import pytest
from transformers import AutoTokenizer

from radixlm.runtime.detokenizer import Detokenizer
from radixlm.runtime.generate_input import InputLimits, prepare_generate
from radixlm.runtime.messages import (BatchStrOut, BatchTokenOut, ControlReq, FinishReason, GenerateReq, RequestError,
                                      TokenOut, encode)
from radixlm.runtime.scheduler.loop import QUEUE_FULL
from radixlm.runtime.server.errors import from_request_error


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    return AutoTokenizer.from_pretrained(str(tiny_llama_dir))


def _req(tokenizer, stream: bool, n: int = 1) -> GenerateReq:
    (p,), _ = prepare_generate(tokenizer, InputLimits(384, 512, 4096), text="The quick", stream=stream,
                               sampling_params={"max_new_tokens": 4, "n": n}, rid="r")
    rids = ["r"] if n == 1 else [f"r-{i}" for i in range(n)]
    return GenerateReq(p.msg, rids, True)


def test_messages_round_trip_through_msgpack(tokenizer):
    msg = _req(tokenizer, stream=True, n=2)
    decoded = msgspec.msgpack.Decoder(Union[GenerateReq, BatchTokenOut, ControlReq]).decode(encode(msg))
    assert decoded == msg and isinstance(decoded, GenerateReq)


def test_detokenizer_streams_only_for_streaming_requests_and_forgets_finished(tokenizer):
    ids = tokenizer("quick brown fox").input_ids
    for stream in (True, False):
        detok = Detokenizer(tokenizer)
        assert detok.handle(_req(tokenizer, stream)) is None and list(detok.states) == ["r"]
        first = detok.handle(BatchTokenOut([TokenOut("r", ids[:1], 2, 1, 0), TokenOut("ghost", [1], 1, 1, 0)]))
        assert isinstance(first, BatchStrOut) and [o.rid for o in first.outputs] == ["r"]  # unknown rid dropped
        assert (first.outputs[0].payload is not None) == stream and not first.outputs[0].finished
        last = detok.handle(BatchTokenOut([TokenOut("r", ids[1:], 2, len(ids), 0, FinishReason("length", length=4))]))
        out = last.outputs[0]
        assert out.finished and out.payload["text"] == tokenizer.decode(ids) and detok.states == {}
        assert out.payload["output_ids"] == ids


def test_finish_codes_map_to_statuses(tokenizer):
    detok = Detokenizer(tokenizer)
    detok.handle(_req(tokenizer, stream=False))
    out = TokenOut("r", [], 2, 0, 0, FinishReason("abort", message="the waiting queue is full"), error=QUEUE_FULL)
    decoded = msgspec.msgpack.Decoder(BatchTokenOut).decode(encode(BatchTokenOut([out])))  # typed across the wire
    final = detok.handle(decoded).outputs[0]
    assert final.error == QUEUE_FULL and from_request_error(final.error).status == 503 and detok.states == {}
    assert "error_code" not in final.payload["meta_info"]  # the payload stays the native response shape
    assert final.payload["meta_info"]["finish_reason"] == {"type": "abort", "message": "the waiting queue is full"}
    bad = RequestError("invalid_grammar", "regex: unbalanced (", "regex")
    err = from_request_error(bad)
    assert (err.status, err.param, err.code, err.message) == (400, "regex", "invalid_grammar", "regex: unbalanced (")
    detok.handle(_req(tokenizer, stream=False))
    ok = detok.handle(BatchTokenOut([TokenOut("r", [5], 2, 1, 0, FinishReason("length", length=1))])).outputs[0]
    assert ok.error is None and ok.finished
