"""Runtime: launch a local radixlm server as a subprocess and use it as a frontend backend.

Runs in the user's process; the server runs in its own process group (`python -m
radixlm.launch_server`, the same flags as `radixlm serve`). Start-up polls /health_generate (a real one-token
generation), so the Runtime is usable as soon as the constructor returns. `shutdown()` (also run at
interpreter exit) terminates the whole group: the server's scheduler and detokenizer children too.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import httpx

from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint

SERVER_MODULE = "radixlm.launch_server"


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def server_flags(options: dict[str, Any]) -> list[str]:
    """CLI flags for server options: `max_total_tokens=4096` -> `--max-total-tokens 4096`;
    True -> a bare flag; False / None -> omitted."""
    flags: list[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        flags.extend([flag] if value is True else [flag, str(value)])
    return flags


class Runtime:
    """`Runtime(model_path=..., **server_options)`: a launched server plus its RuntimeEndpoint."""

    def __init__(self, model_path: str | None = None, log_level: str = "error", launch_timeout: float = 300.0,
                 host: str = "127.0.0.1", port: int = 30000, api_key: str | None = None, **server_options: Any):
        while not _port_is_free(host, port):
            port += 1
        self.url = f"http://{host}:{port}"
        self.generate_url = self.url + "/generate"
        self.api_key = api_key
        options = {"model_path": model_path, "host": host, "port": port, "api_key": api_key,
                   "log_level": log_level, **server_options}
        self.command = [sys.executable, "-m", SERVER_MODULE, *server_flags(options)]
        # Own process group: shutdown reaches every process the server spawns.
        self.process: subprocess.Popen[bytes] | None = subprocess.Popen(self.command, start_new_session=True)
        atexit.register(self.shutdown)
        try:
            self._wait_healthy(launch_timeout)
            self.endpoint = RuntimeEndpoint(self.url, api_key=api_key)
        except BaseException:
            self.shutdown()
            raise

    def _wait_healthy(self, timeout: float) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + timeout
        with httpx.Client(headers=headers, timeout=30.0) as client:
            while time.monotonic() < deadline:
                if self.process is None or self.process.poll() is not None:
                    code = None if self.process is None else self.process.returncode
                    raise RuntimeError(f"server exited during start-up (exit code {code}); see its log above")
                try:
                    if client.get(self.url + "/health_generate").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                time.sleep(0.5)
        raise TimeoutError(f"server at {self.url} not healthy within {timeout:.0f}s")

    def shutdown(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's process group (it drains), then SIGKILL whatever is left."""
        process, self.process = self.process, None
        if process is None:
            return
        endpoint = getattr(self, "endpoint", None)
        if endpoint is not None:
            endpoint.shutdown()
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(process.pid, signal.SIGKILL)  # children that outlived the server
        process.wait()

    def cache_prefix(self, prefix: str) -> None:
        self.endpoint.cache_prefix(prefix)

    def get_server_info(self) -> dict[str, Any]:
        return self.endpoint.get_server_info()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
