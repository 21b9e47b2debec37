"""`--dp-size 2` inside one server: two scheduler processes behind one tokenizer manager, requests routed
cache-aware (docs/scaling.md). One dp=2 server for the module, compared with the shared dp=1 server; the
last test kills one rank, which must take the whole server down."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from radixlm.runtime.cli import build_serve_parser, cmd_serve, server_config
from radixlm.runtime.messages import ControlResp, Heartbeat, ProcessReady
from radixlm.runtime.server.dp_dispatch import DpDispatcher, combine, scheduler_name
from radixlm.runtime.server.metrics import ServerMetrics
from radixlm.runtime.server.tokenizer_manager import TokenizerManager

from .conftest import (ADMIN_KEY, CANARY, LONG_PARAMS, ServerProcess, assert_healthy, ipc_dirs, num_running,
                       pid_alive, wait_until)

PREFIX = ("You are a careful assistant for the tenant Orion. Answer briefly, cite sources, never guess, and "
          "keep every answer under three sentences. ")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,",
           "1, 2, 3, 4,", "Rust and Go are both", "The quick brown fox jumps", "SELECT * FROM users WHERE",
           "Dear hiring manager, I am writing"]
GREEDY = {"max_new_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def dp_server(tiny_llama_dir, request):
    srv = ServerProcess(tiny_llama_dir, "--dp-size", "2")
    try:
        request.getfixturevalue("server")  # the dp=1 reference starts while this one loads
        srv.wait_ready()
        srv.pids = srv.debug()["pids"]
        with srv.client() as c:
            srv.canary = c.post("/generate", json=CANARY).json()["text"]
        yield srv
    finally:
        srv.stop()
    assert not ipc_dirs(srv), "socket directory left behind"
    srv.remove_tmpdir()


def routed_counts(info: dict) -> list[int]:
    return [r["num_routed"] for r in info["dp_routing"]]


def routed(client: httpx.Client) -> list[int]:
    return routed_counts(client.get("/get_server_info").json())


def generate(client: httpx.Client, text: str, **params) -> dict:
    res = client.post("/generate", json={"text": text, "sampling_params": {**GREEDY, **params}})
    assert res.status_code == 200, res.text
    return res.json()


def test_two_ranks_start_and_report(dp_server):
    assert {"scheduler0", "scheduler1", "detokenizer"} <= dp_server.pids.keys()
    assert dp_server.pids["scheduler0"] != dp_server.pids["scheduler1"]
    with dp_server.client() as c:
        info = c.get("/get_server_info").json()
    assert info["dp_size"] == 2 and info["dp_load_balance"] == "cache_aware"
    assert len(info["dp_ranks"]) == 2 and len(info["dp_routing"]) == 2
    per_rank_free = [r["num_free_tokens"] for r in info["dp_ranks"]]
    assert info["num_free_tokens"] == sum(per_rank_free) and min(per_rank_free) > 0
    with dp_server.client() as c:
        assert c.get("/health_generate").status_code == 200
        after = c.get("/get_server_info").json()
    # One probe per rank, placed directly (not through the routing trees).
    assert [a["cache_stats"]["num_requests"] - b["cache_stats"]["num_requests"]
            for a, b in zip(after["dp_ranks"], info["dp_ranks"])] == [1, 1]
    assert routed_counts(after) == routed_counts(info)


def test_greedy_outputs_match_dp1_under_concurrency(dp_server, server):
    with server.client() as ref:
        expected = [generate(ref, p)["output_ids"] for p in PROMPTS]
    with dp_server.client() as c, ThreadPoolExecutor(len(PROMPTS)) as pool:
        assert c.post("/flush_cache", headers=dp_server.headers(ADMIN_KEY)).status_code == 200
        before = c.get("/get_server_info").json()
        got = list(pool.map(lambda p: generate(c, p)["output_ids"], PROMPTS))
        after = c.get("/get_server_info").json()
    assert got == expected
    # Unrelated prompts spread: each starts on the emptier approximate cache, so both ranks run some.
    new_routed = [a["num_routed"] - b["num_routed"] for a, b in zip(after["dp_routing"], before["dp_routing"])]
    new_reqs = [a["cache_stats"]["num_requests"] - b["cache_stats"]["num_requests"]
                for a, b in zip(after["dp_ranks"], before["dp_ranks"])]
    assert sum(new_routed) == len(PROMPTS) and min(new_routed) >= 2, new_routed
    assert new_reqs == new_routed  # the rank the router counted is the rank that ran it
    assert all(r["load"] == 0 for r in after["dp_routing"])  # released on finish


def test_shared_prefix_stays_on_one_rank(dp_server):
    with dp_server.client() as c:
        assert c.post("/flush_cache", headers=dp_server.headers(ADMIN_KEY)).status_code == 200
        start = routed(c)
        metas = [generate(c, PREFIX + f"Question {i}: what is {i} plus {i}?", max_new_tokens=2)["meta_info"]
                 for i in range(4)]
        mid = routed(c)
        generate(c, "An unrelated prompt about the weather in Lisbon", max_new_tokens=2)
        end = routed(c)
    prefix_ranks = [m - s for m, s in zip(mid, start)]
    assert sorted(prefix_ranks) == [0, 4], prefix_ranks  # all four on one rank
    assert metas[0]["cached_tokens"] == 0
    assert all(m["cached_tokens"] >= 0.5 * m["prompt_tokens"] for m in metas[1:]), metas
    hit = sum(m["cached_tokens"] for m in metas) / sum(m["prompt_tokens"] for m in metas)
    print(f"dp=2 cache_aware shared-prefix hit rate {hit:.3f}")
    # The unrelated prompt goes to the other, emptier rank.
    assert [e - m for e, m in zip(end, mid)] == [1 if n == 0 else 0 for n in prefix_ranks]


def test_n_children_share_a_rank_and_openai_chat_works(dp_server):
    with dp_server.client() as c:
        start = routed(c)
        res = c.post("/generate", json={"text": PREFIX + "Pick a colour.", "sampling_params": {
            "n": 3, "max_new_tokens": 4, "temperature": 0.8}})
        assert res.status_code == 200 and len(res.json()) == 3
        assert sorted(e - s for e, s in zip(routed(c), start)) == [0, 1]  # one routing decision, one rank
        model = c.get("/v1/models").json()["data"][0]["id"]
        chat = c.post("/v1/chat/completions", json={"model": model, "max_tokens": 5, "temperature": 0,
                                                    "messages": [{"role": "user", "content": "Hello there"}]})
        assert chat.status_code == 200, chat.text
        body = chat.json()
        assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 5
    assert_healthy(dp_server)


def test_abort_by_rid_abort_all_and_flush(dp_server):
    with dp_server.client() as c, dp_server.client(ADMIN_KEY) as admin, ThreadPoolExecutor(2) as pool:
        body = {"text": PROMPTS[0], "rid": "dp-long", "stream": True, "sampling_params": LONG_PARAMS}
        with c.stream("POST", "/generate", json=body) as res:
            lines = res.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            assert c.post("/abort_request", json={"rid": "dp-long"}).json()["aborted"] is True
            events = [json.loads(l[6:]) for l in lines if l.startswith("data: ") and l != "data: [DONE]"]
        assert events[-1]["meta_info"]["finish_reason"]["type"] == "abort"
        assert admin.post("/flush_cache").status_code == 200  # idle again: both routing trees start empty
        # Two long requests on two ranks (unrelated prompts spread), both ended by one abort_all. They
        # outlive the test unless aborted, so both are certainly still running when abort_all lands.
        futures = [pool.submit(c.post, "/generate", json={"text": p, "sampling_params": LONG_PARAMS})
                   for p in PROMPTS[1:3]]
        wait_until(lambda: num_running(dp_server) == 2, "both requests run")
        running = [r["num_running_reqs"] for r in c.get("/get_server_info").json()["dp_ranks"]]
        assert c.post("/abort_request", json={"abort_all": True}).status_code == 200
        results = [f.result().json()["meta_info"] for f in futures]
        assert [m["finish_reason"]["type"] for m in results] == ["abort", "abort"], results
        assert running == [1, 1], running
        assert admin.post("/flush_cache").status_code == 200
        info = c.get("/get_server_info").json()
        assert all(r["tree_tokens"] == 0 and r["load"] == 0 for r in info["dp_routing"])
        assert all(r["cache_stats"]["cached_tree_tokens"] == 0 for r in info["dp_ranks"])
    assert_healthy(dp_server)


def test_metrics_sum_the_ranks(dp_server):
    with dp_server.client() as c:
        generate(c, PROMPTS[4])
        ranks = dp_server.debug()["scheduler"]["dp_ranks"]

        def kv_total() -> float:
            metrics = c.get("/metrics").text
            return next(float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("radixlm_kv_total_tokens "))

        # The gauge is summed from each rank's latest heartbeat (every 0.5 s): wait for both to be in.
        wait_until(lambda: kv_total() == sum(r["num_total_tokens"] for r in ranks), "the gauge sums both ranks")
    assert len(ranks) == 2


def test_killing_one_rank_takes_the_server_down(dp_server):
    """Last in the module: the shared dp=2 server is gone afterwards (the fixture's stop is then a no-op)."""
    os.kill(dp_server.pids["scheduler1"], signal.SIGKILL)
    code = dp_server.proc.wait(180)
    assert code == 1, "".join(dp_server.lines[-20:])
    assert any("scheduler1 process died" in line for line in dp_server.lines)
    deadline = time.monotonic() + 60  # bounds a failure only
    while any(pid_alive(p) for p in dp_server.pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in dp_server.pids.values()), "orphan processes"


# ---- no server -----------------------------------------------------------------------------------
def test_dispatcher_routes_by_prefix_and_tracks_load():
    d = DpDispatcher(2)
    shared = list(range(100, 180))
    first = d.choose("t", shared + [1, 2])
    d.assign(["a-0", "a-1"], first)
    assert d.choose("t", shared + [3]) == first  # shares 80 of 81 ids
    assert d.choose("other-tenant", shared + [3]) != first  # no sharing across tenants
    assert [r["load"] for r in d.stats()][first] == 2
    d.release("a-0")
    d.release("a-0")  # a second final output (or an unknown rid) changes nothing
    assert d.stats()[first]["load"] == 1 and d.rank_of("a-1") == first and d.rank_of("a-0") is None
    d.forget([first])
    assert d.stats()[first]["tree_tokens"] == 0
    rr = DpDispatcher(2, "round_robin")
    assert [rr.choose("t", shared) for _ in range(4)] == [0, 1, 0, 1]
    assert DpDispatcher(1).choose("t", shared) == 0
    assert [scheduler_name(0, 1), scheduler_name(1, 2)] == ["scheduler", "scheduler1"]


def test_any_silent_rank_is_the_stalest_heartbeat_and_gauges_sum():
    tm = TokenizerManager(None, None, None, 10, ServerMetrics(), dp_size=2)
    beat = dict(num_forward_steps=1, num_running=1, num_waiting=0, num_free_tokens=90, num_total_tokens=100,
                num_cached_tokens=5)
    tm.last_heartbeats = [0.0, 0.0]
    tm._handle(Heartbeat(**beat, dp_rank=1))
    assert tm.silent_scheduler() == "scheduler0" and tm.last_heartbeat == 0.0  # rank 0 never reported
    tm._handle(Heartbeat(**beat, dp_rank=0))
    assert tm.last_heartbeat > 0.0
    assert (tm.heartbeat.num_total_tokens, tm.heartbeat.num_free_tokens, tm.heartbeat.num_running) == (200, 180, 2)
    tm._handle(ProcessReady("scheduler", 1, {"max_total_num_tokens": 100}, dp_rank=1))
    tm._handle(ProcessReady("detokenizer", 2))
    assert not tm._ready_event.is_set()  # scheduler0 has not reported yet
    tm._handle(ProcessReady("scheduler", 3, {"max_total_num_tokens": 80}, dp_rank=0))
    assert tm._ready_event.is_set() and tm.scheduler_info()["max_total_num_tokens"] == 80


def test_combine_sums_numbers_ands_flags_and_recomputes_hit_rate():
    a = ControlResp("r", True, {"idle": True, "num_free_tokens": 10, "cache_stats": {
        "prompt_tokens": 10, "cached_tokens": 5, "hit_rate": 0.5}, "model": "m"})
    b = ControlResp("r", False, {"idle": False, "num_free_tokens": 7, "cache_stats": {
        "prompt_tokens": 30, "cached_tokens": 5, "hit_rate": 1 / 6}, "model": "m"}, error="busy")
    out = combine([a, b])
    assert not out.ok and out.error == "dp rank 1: busy"
    assert out.data["idle"] is False and out.data["num_free_tokens"] == 17 and out.data["model"] == "m"
    assert out.data["cache_stats"]["hit_rate"] == 0.25 and out.data["dp_ranks"] == [a.data, b.data]
    assert combine([a]) is a


def test_dp_flags_parse_and_dp_with_tp_is_refused(capsys):
    args = build_serve_parser().parse_args(["--data-parallel-size", "3", "--dp-load-balance", "round_robin"])
    cfg = server_config(args)
    assert (cfg.dp_size, cfg.dp_load_balance) == (3, "round_robin")
    assert server_config(build_serve_parser().parse_args([])).dp_size == 1
    assert cmd_serve(build_serve_parser().parse_args(["--dp-size", "2", "--tp-size", "2"])) == 2
    assert "cannot be combined with --tp-size 2" in capsys.readouterr().err
    assert cmd_serve(build_serve_parser().parse_args(["--dp-size", "0"])) == 2
