"""Native API (wire-protocol.md) against a real server; results must equal the in-process Engine's."""

from __future__ import annotations

import json
import math

import httpx
import pytest

import radixlm

from radixlm.runtime.engine import Engine

from .conftest import ADMIN_KEY, LONG_PARAMS, assert_healthy, wait_until

PROMPTS = ["The quick brown fox", "Paris is the capital of", "def main():", "Question: What is two plus two?"]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), num_threads=1) as eng:
        yield eng


def _comparable(result: dict) -> dict:
    meta = {k: v for k, v in result["meta_info"].items() if k not in ("id", "e2e_latency", "cached_tokens")}
    return {**result, "meta_info": meta}


def assert_same(server_results, engine_results) -> None:
    """Equal texts, ids and finish reasons; logprobs equal up to float noise from different batching."""
    if isinstance(server_results, dict):
        server_results, engine_results = [server_results], [engine_results]
    assert len(server_results) == len(engine_results)
    for got, want in zip(server_results, engine_results):
        got, want = _comparable(got), _comparable(want)
        assert got["text"] == want["text"]
        assert got["output_ids"] == want["output_ids"]
        assert got["meta_info"].keys() == want["meta_info"].keys()
        for key, value in want["meta_info"].items():
            _assert_close(got["meta_info"][key], value, key)


def _assert_close(got, want, where: str) -> None:
    if isinstance(want, float):
        assert math.isclose(got, want, abs_tol=1e-3), where
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, list) and len(got) == len(want), where
        for g, w in zip(got, want):
            _assert_close(g, w, where)
    else:
        assert got == want, where


def test_greedy_batch_equals_engine(client, engine):
    params = {"max_new_tokens": 12, "temperature": 0}
    got = client.post("/generate", json={"text": PROMPTS, "sampling_params": params}).json()
    assert isinstance(got, list) and len(got) == len(PROMPTS)
    assert_same(got, engine.generate(PROMPTS, params))


def test_stop_string_and_stop_token_equal_engine(client, engine):
    plain = engine.generate(PROMPTS[0], {"max_new_tokens": 16, "temperature": 0})
    stop = plain["text"][3:5]  # a stop string the greedy output really contains
    params = {"max_new_tokens": 16, "temperature": 0, "stop": [stop], "stop_token_ids": [plain["output_ids"][8]]}
    got = client.post("/generate", json={"text": PROMPTS[0], "sampling_params": params}).json()
    assert_same(got, engine.generate(PROMPTS[0], params))
    assert got["meta_info"]["finish_reason"]["type"] == "stop"


def test_logprobs_all_forms_equal_engine(client, engine):
    body = {"text": PROMPTS[1], "sampling_params": {"max_new_tokens": 5, "temperature": 0}, "return_logprob": True,
            "logprob_start_len": 0, "top_logprobs_num": 3, "token_ids_logprob": [5, 7],
            "return_text_in_logprobs": True}
    got = client.post("/generate", json=body).json()
    want = engine.generate(PROMPTS[1], body["sampling_params"], return_logprob=True, logprob_start_len=0,
                           top_logprobs_num=3, token_ids_logprob=[5, 7], return_text_in_logprobs=True)
    assert_same(got, want)
    meta = got["meta_info"]
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"] and meta["input_token_logprobs"][0][0] is None
    assert len(meta["output_top_logprobs"][0]) == 3 and isinstance(meta["output_token_logprobs"][0][2], str)


def test_sampled_n_with_seed_equals_engine(client, engine):
    params = {"max_new_tokens": 8, "temperature": 0.9, "n": 3, "sampling_seed": 11}
    got = client.post("/generate", json={"text": PROMPTS[2], "sampling_params": params}).json()
    assert len(got) == 3
    assert_same(got, engine.generate(PROMPTS[2], params))


def test_input_ids_batch_and_prefill_only(client, engine, server):
    ids = [[5, 6, 7, 8], [9, 10, 11]]
    params = {"max_new_tokens": 6, "temperature": 0}
    assert_same(client.post("/generate", json={"input_ids": ids, "sampling_params": params}).json(),
                engine.generate(input_ids=ids, sampling_params=params))
    body = {"input_ids": ids[0], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
            "logprob_start_len": 0}
    got = client.post("/generate", json=body).json()
    assert got["text"] == "" and got["meta_info"]["completion_tokens"] == 0
    assert got["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert len(got["meta_info"]["input_token_logprobs"]) == 4
    assert_same(got, engine.generate(input_ids=ids[0], sampling_params={"max_new_tokens": 0}, return_logprob=True,
                                     logprob_start_len=0))


def test_select_style_scoring(client):
    """What the frontend's select sends: a batch, max_new_tokens 0, logprob_start_len L-2."""
    prefix = client.post("/generate", json={"text": "Paris is", "sampling_params": {"max_new_tokens": 0}}).json()
    start = prefix["meta_info"]["prompt_tokens"] - 2
    body = {"text": ["Paris is the capital", "Paris is a fox"], "return_logprob": True, "logprob_start_len": start,
            "return_text_in_logprobs": True, "sampling_params": {"max_new_tokens": 0, "temperature": 0}}
    got = client.post("/generate", json=body).json()
    for res in got:
        entries = res["meta_info"]["input_token_logprobs"]
        assert len(entries) == res["meta_info"]["prompt_tokens"] - start and entries[0][0] is None


def stream_events(client: httpx.Client, body: dict, path: str = "/generate") -> list:
    events = []
    with client.stream("POST", path, json=body) as res:
        assert res.status_code == 200 and res.headers["content-type"].startswith("text/event-stream")
        for line in res.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_stream_cumulative_text_and_incremental_logprobs(client):
    body = {"text": PROMPTS[3], "sampling_params": {"max_new_tokens": 10, "temperature": 0}, "return_logprob": True}
    full = client.post("/generate", json=body).json()
    events = stream_events(client, {**body, "stream": True})
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert texts[-1] == full["text"] and events[-1]["output_ids"] == full["output_ids"]
    pieces = [entry for e in events for entry in e["meta_info"]["output_token_logprobs"]]
    _assert_close(pieces, full["meta_info"]["output_token_logprobs"], "stream logprobs")
    assert events[-1]["meta_info"]["output_token_logprobs_length"] == len(full["output_ids"])
    assert events[-1]["meta_info"]["finish_reason"] == full["meta_info"]["finish_reason"]


def test_model_and_server_info(client, server, tiny_llama_dir):
    for path in ("/get_model_info", "/model_info"):
        info = client.get(path).json()
        assert info["model_path"] == str(tiny_llama_dir) and "llama" in info["model_path"]
        assert info["is_generation"] is True and "<|im_start|>" in info["chat_template"]
    for path in ("/get_server_info", "/server_info"):
        info = client.get(path).json()
        assert info["max_total_num_tokens"] > 0 and "hit_rate" in info["cache_stats"] and info["version"]
        # The name /v1/models lists (SGLang's router registers a worker under it).
        assert info["served_model_name"] == tiny_llama_dir.name == client.get("/v1/models").json()["data"][0]["id"]
        assert "key-tenant" not in json.dumps(info)  # secrets never echoed
        assert info["version"] == radixlm.__version__
    assert client.get("/version").json() == {"version": radixlm.__version__}


def test_flush_cache_abort_by_exact_rid_and_concate(client, server):
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert client.post("/flush_cache", headers=admin).status_code == 200
    assert client.get("/flush_cache", headers=admin).status_code == 200
    # Outlives the test unless aborted: still running at every step below, however slow the machine.
    body = {"text": PROMPTS[0], "rid": "long-request", "stream": True, "sampling_params": LONG_PARAMS}
    with client.stream("POST", "/generate", json=body) as res:
        lines = res.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        assert client.post("/flush_cache", headers=admin).status_code == 400  # requests are running
        assert client.post("/abort_request", json={"rid": "long-request-0"}).json()["aborted"] is False
        assert client.post("/abort_request", json={"rid": "long-request"}).json()["aborted"] is True
        events = [json.loads(l[6:]) for l in lines if l.startswith("data: ") and l != "data: [DONE]"]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    res = client.post("/concate_and_append_request", json={"src_rids": ["a", "b"], "dst_rid": "c"})
    assert res.status_code == 200
    assert_healthy(server)


def test_health_generate_and_metrics(client, server):
    assert client.get("/health_generate").status_code == 200
    text = client.get("/metrics").text
    for name in ("radixlm_requests_total", "radixlm_prompt_tokens_total", "radixlm_cached_tokens_total",
                 "radixlm_time_to_first_token_seconds_bucket", "radixlm_inter_token_latency_seconds_bucket",
                 "radixlm_e2e_request_latency_seconds_bucket", "radixlm_kv_cache_usage", "radixlm_num_running_reqs",
                 "radixlm_cache_hit_rate"):
        assert name in text
    values = {l.split()[0]: float(l.split()[-1]) for l in text.splitlines() if l and not l.startswith("#")}
    assert values["radixlm_generation_tokens_total"] > 0
    # Idle now: invariant 1 as gauges, once the next heartbeat (every 0.5 s) has carried the idle state.
    def idle_gauges() -> bool:
        values = {l.split()[0]: float(l.split()[-1]) for l in client.get("/metrics").text.splitlines()
                  if l and not l.startswith("#")}
        return values["radixlm_kv_locked_tokens"] == 0 and values["radixlm_num_running_reqs"] == 0 and (
            values["radixlm_kv_free_tokens"] + values["radixlm_kv_evictable_tokens"] == values["radixlm_kv_total_tokens"])

    wait_until(idle_gauges, "the gauges show the idle invariant")


def test_grammar_compile_time_is_a_metric(client, server):
    def count() -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith("radixlm_grammar_compile_seconds_count"):
                return float(line.split()[-1])
        return 0.0

    before = count()
    res = client.post("/generate", json={"text": "Code:", "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "regex": "[0-9]{3}-metric-[a-z]{2}"}})
    assert res.status_code == 200
    wait_until(lambda: count() >= before + 1, "the next heartbeat carried the compile time")


def test_grammar_refusals_have_their_own_finish_reason(client, server):
    def count(reason: str) -> float:
        prefix = f'radixlm_requests_total{{finish_reason="{reason}"}}'
        return next((float(l.split()[-1]) for l in client.get("/metrics").text.splitlines()
                     if l.startswith(prefix)), 0.0)

    aborts, refused = count("abort"), count("invalid_request")
    for bad in ({"regex": "(unclosed"}, {"json_schema": '{"type": "no-such-type"}'}):
        res = client.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 4, **bad}})
        assert res.status_code == 400, res.text
    # Counted when the refusal reaches the HTTP process, before the 400 is sent.
    assert (count("abort"), count("invalid_request")) == (aborts, refused + 2)
