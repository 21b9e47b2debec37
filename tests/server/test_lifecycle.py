"""Process lifecycle on servers of their own: KV pressure and overload on a small server, then killing its
scheduler; SIGTERM drain; a hung scheduler (watchdog); a killed detokenizer; a SIGKILLed server. Each must
exit with the right code and leave no orphan process and no socket directory."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Iterator

import httpx
import pytest

from .conftest import ServerProcess, ipc_dirs, pid_alive, wait_until

SMALL = ("--max-running-requests", "4", "--max-queued-requests", "4", "--max-total-tokens", "300",
         "--chunked-prefill-size", "64")


@pytest.fixture(scope="module")
def servers(tiny_llama_dir):
    """Start all of this module's servers at once so their start-ups overlap."""
    # Timeouts only bound a failure: a loaded machine must neither run out of drain time nor starve an
    # idle scheduler's heartbeat long enough to look hung (2 s did, at load 16 on 2 cores).
    procs = {"small": ServerProcess(tiny_llama_dir, *SMALL),
             "drain": ServerProcess(tiny_llama_dir, "--drain-timeout", "600"),
             "watchdog": ServerProcess(tiny_llama_dir, "--watchdog-timeout", "30"),
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


def assert_gone(srv: ServerProcess, expect_success: bool, timeout: float = 180.0) -> None:
    code = srv.proc.wait(timeout)
    assert (code == 0) == expect_success, "".join(srv.lines[-20:])
    deadline = time.monotonic() + 60  # bounds a failure only
    while any(pid_alive(pid) for pid in srv.pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(pid) for pid in srv.pids.values()), "orphan processes"
    assert not ipc_dirs(srv), "socket directory left behind"


@contextmanager
def scheduler_paused(srv: ServerProcess) -> Iterator[None]:
    """SIGSTOP the scheduler: requests pile up in the HTTP process and the inbox and none can finish, so a
    test can make them overlap however slow the machine is. /health keeps answering (it never waits on the
    scheduler, and the watchdog allows minutes); anything that asks the scheduler must wait until after."""
    os.kill(srv.pids["scheduler"], signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(srv.pids["scheduler"], signal.SIGCONT)


def wait_for_n_done(futures: list[Future], n: int, timeout: float = 120.0) -> list[Future]:
    done: set[Future] = set()
    deadline = time.monotonic() + timeout
    while len(done) < n:
        assert time.monotonic() < deadline, f"only {len(done)} of {n} requests answered"
        done |= wait(set(futures) - done, timeout=1.0, return_when=FIRST_COMPLETED).done
    return list(done)


def test_kv_pressure_retracts_and_keeps_greedy_outputs(servers, server):
    bodies = [{"text": f"Question {i}: what is the capital of France?", "sampling_params": {
        "max_new_tokens": 100, "temperature": 0, "ignore_eos": True}} for i in range(4)]
    with server.client() as ref_client:
        expected = [ref_client.post("/generate", json=b).json()["output_ids"] for b in bodies]
    small = servers["small"]
    with small.client() as client:
        # One batch: the four reach the scheduler together and run together (4 x ~110 tokens > 300 slots),
        # however slow the machine; four separate requests could each finish before the next arrived.
        res = client.post("/generate", json={"text": [b["text"] for b in bodies],
                                             "sampling_params": bodies[0]["sampling_params"]})
        assert [r["output_ids"] for r in res.json()] == expected
        assert client.get("/server_info").json()["cache_stats"]["num_retractions"] > 0
        assert small.debug()["ok"]


def test_overload_gets_fast_503_and_health_stays_green(servers):
    small = servers["small"]
    body = {"text": "Overload", "sampling_params": {"max_new_tokens": 100, "temperature": 0, "ignore_eos": True}}
    with small.client(timeout=120) as client, ThreadPoolExecutor(16) as pool:
        # The scheduler cannot finish anything meanwhile: the 8 the HTTP process admits (4 running + 4
        # queued) wait, the other 8 are refused without waiting on the scheduler, /health stays green.
        with scheduler_paused(small):
            futures = [pool.submit(client.post, "/generate", json=body) for _ in range(16)]
            refused = [f.result() for f in wait_for_n_done(futures, 8)]
            health = [httpx.get(small.url + "/health", timeout=30).status_code for _ in range(3)]
        results = [f.result() for f in futures]
    assert all(r.status_code == 503 and r.headers.get("retry-after") for r in refused), refused
    # The 8 admitted then reach the scheduler at once; past its 4 running slots its own queue bound may
    # refuse some of the rest, also with a 503 (queue_full).
    codes = [r.status_code for r in results]
    assert set(codes) <= {200, 503} and 4 <= codes.count(200) <= 8, codes
    assert all(r.headers.get("retry-after") for r in results if r.status_code == 503)
    assert set(health) == {200}
    assert small.debug()["ok"]


def test_killing_the_scheduler_fails_fast_and_leaves_nothing(servers):
    small = servers["small"]
    os.kill(small.pids["scheduler"], signal.SIGKILL)

    def health() -> int | str:
        try:
            return httpx.get(small.url + "/health", timeout=30).status_code
        except httpx.HTTPError:
            return "closed"  # already exited

    assert wait_until(lambda: (status := health()) != 200 and status, "the server noticed") in (503, "closed")
    assert_gone(small, expect_success=False)


def test_sigterm_drains_in_flight_work_then_exits_zero(servers):
    srv = servers["drain"]
    body = {"text": "Drain me", "stream": True,
            "sampling_params": {"max_new_tokens": 100, "temperature": 0, "ignore_eos": True}}
    with srv.client() as client, client.stream("POST", "/generate", json=body) as res:
        lines = res.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        # Paused, the request cannot finish (and let the drained server exit) before we have looked.
        with scheduler_paused(srv):
            os.killpg(srv.proc.pid, signal.SIGTERM)  # the whole group, like Ctrl-C or Runtime.shutdown()
            wait_until(lambda: client.get("/health").status_code == 503, "SIGTERM started a drain")
            refused = client.post("/generate", json={**body, "stream": False})
            assert refused.status_code == 503 and refused.headers["retry-after"]
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and '"length": 100' in rest[-2]
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


def test_a_taken_port_fails_before_the_model_loads(tmp_path):
    """The port is bound first: a taken one is a one-line error and exit code 2, before any model is read
    (the model directory here is empty: reading it would fail on its missing config.json)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "radixlm.launch_server", "--port", str(port),
                              "--model-path", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in res.stderr
    assert "Traceback" not in res.stderr and "config.json" not in res.stderr + res.stdout
