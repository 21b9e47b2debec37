"""A minimal headless-Chromium driver over the DevTools protocol (websockets; no chromedriver needed), for the
dashboard's browser tests and docs screenshots (`python -m tests.server.test_dashboard_cdp URL OUT.png`).
It holds no tests itself."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import httpx

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium with one page; `evaluate` runs JavaScript in the page and returns its value."""

    def __init__(self, width: int = 1400, height: int = 1000, timeout: float = 60.0):
        from websockets.sync.client import connect

        exe = find_chromium()
        if exe is None:
            raise RuntimeError("Chromium is not installed")
        self.profile = tempfile.mkdtemp(prefix="radixlm-chromium-")
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--no-default-browser-check", "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "--hide-scrollbars", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("Chromium did not start")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=30).json() if t["type"] == "page"]
        self._ws_cm = connect(pages[0]["webSocketDebuggerUrl"], max_size=64 << 20, open_timeout=timeout)
        self.ws = self._ws_cm.__enter__()
        self._id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, timeout: float = 60.0, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=timeout))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def wait_for(self, expression: str, what: str, timeout: float = 120.0) -> Any:
        """Poll a page state until it is truthy (returned); the timeout only bounds a failure."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except RuntimeError:
                value = None  # e.g. the page is still loading
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out waiting until {what}"
            time.sleep(0.1)

    def screenshot(self, path: str | Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            h = self.evaluate("document.documentElement.scrollHeight")
            w = self.evaluate("document.documentElement.scrollWidth")
            params["clip"] = {"x": 0, "y": 0, "width": w, "height": h, "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", **params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        cm = getattr(self, "_ws_cm", None)
        if cm is not None:
            cm.__exit__(None, None, None)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _main(argv: list[str]) -> None:
    """Screenshot a page once `ready` (a JS expression) holds: URL OUT.png [READY] [SELECTOR-TO-HOVER]."""
    url, out = argv[0], argv[1]
    ready = argv[2] if len(argv) > 2 else "document.readyState === 'complete'"
    with Browser() as b:
        b.goto(url)
        b.wait_for(ready, "the page is ready")
        time.sleep(0.3)  # the last frame paints (a screenshot for docs, not a test)
        b.screenshot(out, full_page=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
