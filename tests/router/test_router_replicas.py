"""The router in front of two real tiny `radixlm serve` replicas on loopback.

A multi-tenant shared-prefix workload reaches a higher radix-cache hit rate through the cache-aware
router than through round-robin (both measured from the replicas' own cached_tokens); streaming and the
OpenAI routes pass through; killing one replica keeps the service answering.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn

from radixlm.router import RouterConfig, create_app

TENANT_PREFIXES = [
    "You are a helpful assistant for the Paris office. Answer questions politely. " * 3,
    "def main():\n    print(\"hello world\")\n    return 0\n# Review this code carefully. " * 3,
    "Question: What color is the sky? Answer: blue. Question: What is two plus two? " * 3,
]
PARAMS = {"max_new_tokens": 2, "temperature": 0}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Replica:
    def __init__(self, model_dir):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "radixlm.launch_server", "--model-path", str(model_dir), "--port",
                str(self.port), "--log-level", "warning", "--num-threads", "1", "--max-total-tokens", "8192"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("radixlm: ready"):
                self.ready.set()
        self.ready.set()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


class RouterThread:
    def __init__(self, config: RouterConfig):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "router did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def replicas(tiny_llama_dir):
    started = [Replica(tiny_llama_dir) for _ in range(2)]
    try:
        for r in started:
            r.ready.wait(240)
            if not any(line.startswith("radixlm: ready") for line in r.lines):
                pytest.fail("replica did not start:\n" + "".join(r.lines[-30:]))
        yield started
    finally:
        for r in started:
            r.kill()


def _router(replicas, policy: str, health_interval_s: float = 0.3) -> RouterThread:
    return RouterThread(RouterConfig(tuple(r.url for r in replicas), policy=policy,
                                     health_interval_s=health_interval_s))


def _hit_rate(router: RouterThread) -> float:
    """Flush every replica, then send 3 tenants x 6 questions interleaved; cached / prompt tokens."""
    with httpx.Client(base_url=router.url, timeout=60) as client:
        assert client.post("/flush_cache").status_code == 200
        cached = prompt = 0
        for i in range(6):
            for prefix in TENANT_PREFIXES:
                res = client.post("/generate", json={"text": prefix + f"Question number {i}?",
                                                     "sampling_params": PARAMS})
                assert res.status_code == 200, res.text
                cached += res.json()["meta_info"]["cached_tokens"]
                prompt += res.json()["meta_info"]["prompt_tokens"]
    return cached / prompt


def test_cache_aware_beats_round_robin(replicas):
    rates = {}
    for policy in ("round_robin", "cache_aware"):
        router = _router(replicas, policy)
        try:
            rates[policy] = _hit_rate(router)
        finally:
            router.stop()
    print(f"\nshared-prefix hit rate: cache_aware {rates['cache_aware']:.3f}, "
          f"round_robin {rates['round_robin']:.3f}")
    assert rates["cache_aware"] > rates["round_robin"]


def test_streaming_and_openai_routes_pass_through(replicas):
    router = _router(replicas, "cache_aware")
    try:
        with httpx.Client(base_url=router.url, timeout=60) as client:
            body = {"text": TENANT_PREFIXES[0], "sampling_params": PARAMS, "stream": True}
            with client.stream("POST", "/generate", json=body) as res:
                assert res.status_code == 200
                assert res.headers["content-type"].startswith("text/event-stream")
                events = [line for line in res.iter_lines() if line.startswith("data:")]
            assert events[-1] == "data: [DONE]" and len(events) >= 2
            models = client.get("/v1/models")
            assert models.status_code == 200
            chat = client.post("/v1/chat/completions", json={
                "model": models.json()["data"][0]["id"], "max_tokens": 2,
                "messages": [{"role": "user", "content": "hello"}]})
            assert chat.status_code == 200, chat.text
            assert chat.json()["object"] == "chat.completion"
    finally:
        router.stop()


def test_killed_replica_fails_over(replicas):
    # No health poll after the first: the failed requests themselves must take the replica out.
    router = _router(replicas, "cache_aware", health_interval_s=3600)
    try:
        with httpx.Client(base_url=router.url, timeout=60) as client:
            for prefix in TENANT_PREFIXES:  # spread the tenants over both replicas
                assert client.post("/generate", json={"text": prefix, "sampling_params": PARAMS}).status_code == 200
            replicas[1].kill()
            for i in range(6):  # some of these prefixes live on the dead replica: they must fail over
                res = client.post("/generate", json={"text": TENANT_PREFIXES[i % 3] + str(i),
                                                     "sampling_params": PARAMS})
                assert res.status_code == 200, res.text
            stats = client.get("/router/stats").json()["replicas"]
            assert [r["healthy"] for r in stats] == [True, False]
            assert stats[1]["num_failures"] >= 1 and stats[0]["load"] == stats[1]["load"] == 0
            assert client.get("/health").status_code == 200
    finally:
        router.stop()
