"""SGLang's own router (the `sglang-router` package, a Rust binary) in front of two tiny `radixlm serve`
workers: it discovers their model from /server_info, health-checks them, and routes SGLang's native
/generate and the OpenAI routes to both (docs/scaling.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import ServerProcess, free_port, wait_until

pytest.importorskip("sglang_router", reason="SGLang's router is not installed (pip install sglang-router)")
openai = pytest.importorskip("openai")

# The router hands this key to the workers for discovery and health checks, and clients send it too.
ROUTER_KEY = "key-router"
CHAT = [{"role": "user", "content": "Say something."}]


class RouterProcess:
    """`python -m sglang_router.launch_router` in its own process group, its log in a temporary file."""

    def __init__(self, workers: list[ServerProcess], *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="sglang-router-", suffix=".log")
        args = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(self.port), "--api-key", ROUTER_KEY, "--log-level", "info",
                "--worker-urls", *(w.url for w in workers), *extra]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, num_workers: int) -> "RouterProcess":
        def ready() -> bool:
            assert self.proc.poll() is None, "router exited:\n" + self.tail()
            try:
                res = httpx.get(self.url + "/readiness", timeout=5)
            except httpx.HTTPError:
                return False
            return res.status_code == 200 and res.json().get("healthy_workers") == num_workers

        wait_until(ready, "the router has registered every worker", timeout=60)
        return self

    def tail(self) -> str:
        self.log.seek(0)
        return "".join(self.log.readlines()[-30:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def workers(tiny_llama_dir):
    started = [ServerProcess(tiny_llama_dir, api_keys=(ROUTER_KEY,)) for _ in range(2)]
    try:
        yield [w.wait_ready() for w in started]
    finally:
        for w in started:
            w.stop()
            w.remove_tmpdir()


@pytest.fixture(scope="module")
def router(workers):
    # Round robin: each worker is certain to get requests (cache_aware would send a repeated prompt to one).
    rp = RouterProcess(workers, "--policy", "round_robin")
    try:
        yield rp.wait_ready(len(workers))
    finally:
        rp.stop()


def _headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ROUTER_KEY}"}


def _finished_requests(worker: ServerProcess) -> float:
    text = httpx.get(worker.url + "/metrics", headers=_headers(), timeout=30).text
    return sum(s.value for family in text_string_to_metric_families(text) if family.name == "radixlm_requests"
               for s in family.samples if s.name == "radixlm_requests_total")


def test_router_registers_the_workers_under_their_served_model_name(router, workers, tiny_llama_dir):
    served = os.path.basename(tiny_llama_dir)
    models = httpx.get(router.url + "/v1/models", headers=_headers(), timeout=30).json()
    assert [m["id"] for m in models["data"]] == [served]
    listed = httpx.get(router.url + "/workers", headers=_headers(), timeout=30).json()["workers"]
    assert sorted(w["url"] for w in listed) == sorted(w.url for w in workers)
    assert {w["model_id"] for w in listed} == {served}


def test_generate_and_openai_routes_reach_both_workers(router, workers, tiny_llama_dir):
    served = os.path.basename(tiny_llama_dir)
    before = [_finished_requests(w) for w in workers]
    with httpx.Client(base_url=router.url, headers=_headers(), timeout=120) as http:
        for _ in range(2):
            res = http.post("/generate", json={"text": "The quick brown fox", "sampling_params":
                                               {"max_new_tokens": 4, "temperature": 0}})
            assert res.status_code == 200, res.text
            assert res.json()["meta_info"]["completion_tokens"] == 4
            res = http.post("/v1/completions", json={"model": served, "prompt": "Hello", "max_tokens": 4})
            assert res.status_code == 200 and res.json()["choices"][0]["finish_reason"] == "length", res.text
    client = openai.OpenAI(base_url=router.url + "/v1", api_key=ROUTER_KEY, max_retries=0, timeout=120)
    for _ in range(2):
        reply = client.chat.completions.create(model=served, messages=CHAT, max_tokens=4, temperature=0)
        assert reply.model == served and reply.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(model=served, messages=CHAT, max_tokens=4, stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"
    # The router fills in a placeholder model when the request names none: the workers accept it.
    res = httpx.post(router.url + "/v1/chat/completions", headers=_headers(), timeout=120,
                     json={"messages": CHAT, "max_tokens": 4})
    assert res.status_code == 200 and res.json()["model"] == served, res.text
    # A worker counts a request once its answer is out: wait for the last ones.
    after = wait_until(lambda: (a := [_finished_requests(w) for w in workers]) and sum(a) - sum(before) >= 8 and a,
                       "the workers have counted every request", timeout=30)
    assert sum(after) - sum(before) == 8
    assert all(a > b for a, b in zip(after, before)), (before, after)


def test_workers_report_their_load_in_sglangs_shape(workers):
    loads = httpx.get(workers[0].url + "/get_load", headers=_headers(), timeout=30).json()
    assert loads == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
