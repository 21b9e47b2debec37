"""Socket-free pieces of the server pipeline: message encoding, the Detokenizer's bookkeeping, and how
scheduler-side finish codes become HTTP errors."""

from __future__ import annotations

from typing import Union

import msgspec
import pytest
from transformers import AutoTokenizer

from radixlm.runtime.detokenizer import Detokenizer
from radixlm.runtime.generate_input import InputLimits, prepare_generate
from radixlm.runtime.messages import BatchStrOut, BatchTokenOut, ControlReq, GenerateReq, TokenOut, encode
from radixlm.runtime.server.http_server import result_error


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
        last = detok.handle(BatchTokenOut([TokenOut("r", ids[1:], 2, len(ids), 0, {"type": "length", "length": 4})]))
        out = last.outputs[0]
        assert out.finished and out.payload["text"] == tokenizer.decode(ids) and detok.states == {}
        assert out.payload["output_ids"] == ids


def test_finish_codes_map_to_statuses(tokenizer):
    detok = Detokenizer(tokenizer)
    detok.handle(_req(tokenizer, stream=False))
    out = TokenOut("r", [], 2, 0, 0, {"type": "abort", "message": "the waiting queue is full"},
                   error={"message": "the waiting queue is full", "param": None, "code": "queue_full"})
    payload = detok.handle(BatchTokenOut([out])).outputs[0].payload
    assert result_error(payload).status == 503 and detok.states == {}
    bad = {"text": "", "meta_info": {"error_code": "invalid_grammar", "error_param": "regex",
                                     "finish_reason": {"type": "abort", "message": "regex: unbalanced ("}}}
    err = result_error(bad)
    assert (err.status, err.param, err.code, err.message) == (400, "regex", "invalid_grammar", "regex: unbalanced (")
    assert result_error({"text": "ok", "meta_info": {"finish_reason": {"type": "length"}}}) is None
