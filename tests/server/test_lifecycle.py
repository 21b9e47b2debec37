"""Process lifecycle on servers of their own: KV pressure and overload on a small server, then killing its
scheduler; SIGTERM drain; a hung scheduler (watchdog); a killed detokenizer; a SIGKILLed server. Each must
exit with the right code and leave no orphan process and no socket directory."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from .conftest import ServerProcess, ipc_dirs, pid_alive

SMALL = ("--max-running-requests", "4", "--max-queued-requests", "4", "--max-total-tokens", "300",
         "--chunked-prefill-size", "64")


@pytest.fixture(scope="module")
def servers(tiny_llama_dir):
    """Start all of this module's servers at once so their start-ups overlap."""
    procs = {"small": ServerProcess(tiny_llama_dir, *SMALL), "drain": ServerProcess(tiny_llama_dir),
             "watchdog": ServerProcess(tiny_llama_dir, "--watchdog-timeout", "2"),
             "detok": ServerProcess(tiny_llama_dir), "main": ServerProcess(tiny_llama_dir)}
    try:
        for srv in procs.values():
            srv.wait_ready()
            srv.pids = srv.debug()["pids"]
        yield procs
    finally:
        for srv in procs.values():
            srv.stop()
    for srv in procs.values():
        assert not ipc_dirs(srv), "socket directory left behind"
        srv.remove_tmpdir()


def assert_gone(srv: ServerProcess, expect_success: bool, timeout: float = 30.0) -> None:
    code = srv.proc.wait(timeout)
    assert (code == 0) == expect_success, "".join(srv.lines[-20:])
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in srv.pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(pid) for pid in srv.pids.values()), "orphan processes"
    assert not ipc_dirs(srv), "socket directory left behind"


def test_kv_pressure_retracts_and_keeps_greedy_outputs(servers, server):
    bodies = [{"text": f"Question {i}: what is the capital of France?", "sampling_params": {
        "max_new_tokens": 100, "temperature": 0, "ignore_eos": True}} for i in range(4)]
    with server.client() as ref_client:
        expected = [ref_client.post("/generate", json=b).json()["output_ids"] for b in bodies]
    small = servers["small"]
    with small.client() as client, ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda b: client.post("/generate", json=b), bodies))
        assert [r.json()["output_ids"] for r in results] == expected
        assert client.get("/server_info").json()["cache_stats"]["num_retractions"] > 0
        assert small.debug()["ok"]


def test_overload_gets_fast_503_and_health_stays_green(servers):
    small = servers["small"]
    # Long enough that the first requests still run when the last arrive (with 80 tokens a loaded CI
    # machine once let every request finish before the 9th arrived: no 503 at all).
    body = {"text": "Overload", "sampling_params": {"max_new_tokens": 160, "temperature": 0, "ignore_eos": True}}
    start_together = threading.Barrier(16)
    health: list[int] = []
    done = threading.Event()

    def poll_health() -> None:
        while not done.is_set():
            health.append(httpx.get(small.url + "/health", timeout=10).status_code)
            time.sleep(0.05)

    # One client for all threads (its pool holds 16 connections), opened before the barrier: a client per
    # request spent its set-up after the barrier, spreading the 16 arrivals out.
    client = httpx.Client(base_url=small.url, headers=small.headers(), timeout=120,
                          limits=httpx.Limits(max_connections=16))

    def post(_: int) -> tuple[int, float, str | None]:
        start_together.wait()
        start = time.monotonic()
        res = client.post("/generate", json=body)
        return res.status_code, time.monotonic() - start, res.headers.get("retry-after")

    watcher = threading.Thread(target=poll_health)
    watcher.start()
    with client, ThreadPoolExecutor(16) as pool:
        results = list(pool.map(post, range(16)))  # 2x the 8 requests the server admits
    done.set()
    watcher.join()
    rejected = [r for r in results if r[0] == 503]
    assert rejected and all(r[0] in (200, 503) for r in results)
    assert all(r[2] is not None and r[1] < 5.0 for r in rejected)
    assert health and set(health) == {200}
    assert small.debug()["ok"]


def test_killing_the_scheduler_fails_fast_and_leaves_nothing(servers):
    small = servers["small"]
    os.kill(small.pids["scheduler"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    status = None
    while time.monotonic() < deadline:
        try:
            status = httpx.get(small.url + "/health", timeout=2).status_code
        except httpx.HTTPError:
            status = "closed"  # already exited
        if status != 200:
            break
        time.sleep(0.05)
    assert status in (503, "closed")
    assert_gone(small, expect_success=False)


def test_sigterm_drains_in_flight_work_then_exits_zero(servers):
    srv = servers["drain"]
    body = {"text": "Drain me", "stream": True,
            "sampling_params": {"max_new_tokens": 300, "temperature": 0, "ignore_eos": True}}
    with srv.client() as client, client.stream("POST", "/generate", json=body) as res:
        lines = res.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        os.killpg(srv.proc.pid, signal.SIGTERM)  # the whole group, like Ctrl-C or Runtime.shutdown()
        deadline = time.monotonic() + 5
        while client.get("/health").status_code == 200:
            assert time.monotonic() < deadline, "SIGTERM did not start a drain"
            time.sleep(0.02)
        refused = client.post("/generate", json={**body, "stream": False})
        assert refused.status_code == 503 and refused.headers["retry-after"]
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and '"length": 300' in rest[-2]
    assert_gone(srv, expect_success=True)


def test_hung_scheduler_trips_the_watchdog(servers):
    srv = servers["watchdog"]
    os.kill(srv.pids["scheduler"], signal.SIGSTOP)
    assert_gone(srv, expect_success=False)
    assert any("hung" in line for line in srv.lines)


def test_killing_the_detokenizer_exits_nonzero(servers):
    srv = servers["detok"]
    os.kill(srv.pids["detokenizer"], signal.SIGKILL)
    assert_gone(srv, expect_success=False)


def test_sigkill_of_the_server_takes_children_and_sockets_with_it(servers):
    srv = servers["main"]
    assert ipc_dirs(srv)  # while it runs, its socket directory exists
    srv.proc.kill()
    assert_gone(srv, expect_success=False)  # children gone (parent-death signal / watch), sockets removed
