"""Real server processes for the server tests: one shared tiny-model server for most tests, and a helper
that starts extra ones for the tests that must kill or SIGTERM them."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

TENANT_KEYS = ("key-tenant-a", "key-tenant-b")
ADMIN_KEY = "key-admin"
STARTUP_TIMEOUT_S = 240.0
CANARY = {"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
# Tiny-model servers get a long context so that a request can be made to outlive any test step: 60000
# tokens take over a minute even on an idle machine, so a test that needs "still running" is certain of
# it until it aborts the request itself (no test waits for one to finish).
LONG_CONTEXT = ("--context-length", "65536")
LONG_PARAMS = {"max_new_tokens": 60000, "temperature": 0, "ignore_eos": True}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`python -m radixlm.launch_server` in its own process group, stdout collected line by line."""

    def __init__(self, model_dir: str | None, *extra: str, api_keys: tuple[str, ...] = TENANT_KEYS):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "radixlm.launch_server", "--port", str(self.port), "--log-level", "warning",
                "--admin-api-key", ADMIN_KEY, "--enable-metrics", *extra]
        if model_dir is not None:
            args += ["--model-path", str(model_dir), *LONG_CONTEXT]
        for key in api_keys:
            args += ["--api-key", key]
        # A private TMPDIR: the server's socket directory goes there, so a test can check it is removed.
        self.tmpdir = tempfile.mkdtemp(prefix="radixlm-test-server-")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": self.tmpdir}
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("radixlm: ready"):
                self._ready.set()
        self._ready.set()  # exited

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> "ServerProcess":
        self._ready.wait(timeout)
        if self.proc.poll() is not None or not any(l.startswith("radixlm: ready") for l in self.lines):
            self.stop()
            raise RuntimeError("server did not start:\n" + "".join(self.lines[-40:]))
        return self

    def remove_tmpdir(self) -> None:
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def headers(self, key: str = TENANT_KEYS[0]) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def client(self, key: str = TENANT_KEYS[0], timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(key), timeout=timeout)

    def debug(self) -> dict:
        res = httpx.get(self.url + "/debug/invariants", headers=self.headers(ADMIN_KEY), timeout=30)
        assert res.status_code == 200, res.text
        return res.json()

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.proc.wait()


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def ipc_dirs(srv: ServerProcess) -> list[str]:
    """Socket directories the server left in its private TMPDIR."""
    return [p.name for p in Path(srv.tmpdir).glob("radixlm-ipc-*")]


@pytest.fixture(scope="session")
def server(tiny_llama_dir):
    srv = ServerProcess(tiny_llama_dir).wait_ready()
    srv.pids = srv.debug()["pids"]
    with srv.client() as c:
        srv.canary = c.post("/generate", json=CANARY).json()["text"]
    yield srv
    srv.stop()
    assert not ipc_dirs(srv), "socket directory left behind"
    srv.remove_tmpdir()


@pytest.fixture(scope="session")
def oai(server):
    """The official openai client on the shared server, as the first tenant."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=TENANT_KEYS[0], max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model(oai):
    """The model id /v1/models lists (the tiny checkpoint's directory name)."""
    return oai.models.list().data[0].id


@pytest.fixture()
def client(server):
    with server.client() as c:
        yield c


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    """Poll a server state until it holds (its value is returned); the timeout only bounds a failure."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)
    return value


def num_running(srv: ServerProcess) -> int:
    """Requests the scheduler(s) are running now (asked live, not from a heartbeat)."""
    return httpx.get(srv.url + "/server_info", headers=srv.headers(), timeout=30).json()["num_running_reqs"]


def assert_healthy(srv: ServerProcess) -> None:
    """robustness.md #5 after any bad request: idle invariants, same pids, health 200, canary identical."""
    # Aborted requests may still be on their way out.
    info = wait_until(lambda: (i := srv.debug())["ok"] and i["tokenizer_manager"]["num_inflight"] == 0 and i,
                      "the server is idle", timeout=60)
    assert info["ok"], info
    assert info["scheduler"]["idle"], info
    assert info["scheduler"]["num_locked_tokens"] == 0, info
    sched = info["scheduler"]
    assert sched["num_free_tokens"] + sched["num_evictable_tokens"] == sched["num_total_tokens"], info
    assert info["pids"] == srv.pids
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
    with srv.client() as c:
        assert c.post("/generate", json=CANARY).json()["text"] == srv.canary
