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


class _Transport:
    idle_wait_s, heartbeat_interval_s = 0.0, None

    def __init__(self):
        self.outputs = []

    def announce(self, msg):
        pass

    def send_outputs(self, outputs):
        self.outputs += outputs


class _Scheduler:
    def __init__(self, fail: Exception | None = None):
        self.added, self.fail = [], fail

    def add_request(self, req):
        if self.fail is not None:
            raise self.fail
        self.added.append(req)


def test_sampling_params_are_validated_once_at_the_edge(tokenizer, monkeypatch):
    """prepare_generate checks the params (once per prompt); the typed Struct then crosses msgpack and
    the scheduler loop and the detokenizer use it as it is: a second check would fail here."""
    from radixlm.runtime.scheduler.loop import SchedulerLoop
    from radixlm.sampling_params import SamplingParams

    calls = []
    original = SamplingParams.normalize
    monkeypatch.setattr(SamplingParams, "normalize", lambda self: (calls.append(1), original(self))[1])
    msg = _req(tokenizer, stream=True, n=2)
    assert calls == [1] and isinstance(msg.req.sampling_params, SamplingParams)

    def refuse(self):
        raise AssertionError("sampling params validated again")

    monkeypatch.setattr(SamplingParams, "normalize", refuse)
    monkeypatch.setattr(SamplingParams, "from_dict", classmethod(lambda cls, d: refuse(None)))
    decoded = msgspec.msgpack.Decoder(GenerateReq).decode(encode(msg))
    assert decoded.req.sampling_params == msg.req.sampling_params
    scheduler, transport = _Scheduler(), _Transport()
    SchedulerLoop(scheduler, transport, lambda m, p, rid, i: (rid, p))._add(decoded)
    assert scheduler.added == [("r-0", decoded.req.sampling_params), ("r-1", decoded.req.sampling_params)]
    assert transport.outputs == []
    Detokenizer(tokenizer).handle(decoded)


def test_scheduler_refusals_travel_as_typed_errors(tokenizer):
    from radixlm.errors import InvalidRequestError
    from radixlm.runtime.scheduler.loop import INTERNAL_ERROR, SchedulerLoop

    msg = _req(tokenizer, stream=False)
    for fail, want in ((OverflowError(), QUEUE_FULL), (RuntimeError("boom"), INTERNAL_ERROR),
                       (InvalidRequestError("regex: bad", "regex", "invalid_grammar"),
                        RequestError("invalid_grammar", "regex: bad", "regex", 400))):
        transport = _Transport()
        SchedulerLoop(_Scheduler(fail), transport, lambda m, p, rid, i: rid)._add(msg)
        (out,) = transport.outputs
        assert out.error == want and out.finish.type == "abort"
        assert "boom" not in out.error.message  # the client is told no internals


def test_python_dicts_are_checked_like_http_bodies(tokenizer):
    """The Engine's and the frontend's sampling_params dicts go through the same msgspec conversion and
    the same error mapping (radixlm/errors.from_validation_error) as a /generate body."""
    from radixlm.errors import InvalidRequestError

    def prepare(params):
        return prepare_generate(tokenizer, InputLimits(384, 512, 4096), text="hi", sampling_params=params)[0][0]

    for params, param, message in (({"temperature": "x"}, "temperature", "`temperature`: Expected `float`, got `str`"),
                                   ({"top_k": True}, "top_k", "`top_k`: Expected `int`, got `bool`"),
                                   ({"bogus_key": 1}, "bogus_key", "`bogus_key`: unknown field"),
                                   ({"logit_bias": {"x": 1.0}}, "logit_bias",
                                    "`logit_bias`: Expected `int`, got `str` (in a key)")):
        with pytest.raises(InvalidRequestError) as info:
            prepare(params)
        assert (info.value.param, str(info.value)) == (param, message)
    p = prepare({"logit_bias": {"5": 1}, "stop": "\n", "temperature": 1, "regex": None})  # JSON's shapes
    assert (p.params.logit_bias, p.params.stop, p.params.temperature, p.params.regex) == ({5: 1.0}, ["\n"], 1.0, None)
