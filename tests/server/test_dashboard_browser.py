"""The dashboard in a real headless browser (Debian's chromium, driven over the DevTools protocol): after a
few-shot program ran against the server, the page shows the shared prefix node with hits > 0, a request
that is still running, and KV pool usage > 0; the program's trace shows at /dashboard/programs. Screenshots
go to test-artifacts/ (gitignored; RADIXLM_TEST_ARTIFACTS overrides). Skips only where Chromium is not
installed (`.ci/run` installs it)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx
import pytest

import radixlm as sgl

from .conftest import ADMIN_KEY, LONG_PARAMS, TENANT_KEYS, wait_until
from .test_dashboard_cdp import Browser, find_chromium

pytestmark = pytest.mark.skipif(find_chromium() is None,
                                reason="Chromium is not installed (apt-get install chromium; .ci/run does)")

ARTIFACTS = Path(os.environ.get("RADIXLM_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
FEW_SHOT = ("Answer in one word.\nQ: Capital of France? A: Paris\nQ: Capital of Italy? A: Rome\n"
            "Q: Capital of Spain? A: Madrid\nQ: Capital of Greece? A: Athens\n")


@sgl.function
def capital(s, country):
    s += FEW_SHOT + "Q: Capital of " + country + "? A:"
    s += sgl.gen("answer", max_tokens=3, temperature=0)


def _hover(browser: Browser, selector: str) -> str:
    """Move the mouse onto the element's centre; the tooltip's text."""
    box = browser.evaluate(f"(() => {{ const r = document.querySelector({selector!r}).getBoundingClientRect();"
                           " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
    browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=box[0], y=box[1])
    return browser.wait_for("!document.getElementById('tooltip').hidden && document.getElementById('tooltip').textContent",
                            "the tooltip shows")


def test_dashboard_shows_the_cache_a_running_request_and_the_pool(server):
    backend = sgl.RuntimeEndpoint(server.url, api_key=TENANT_KEYS[0])
    try:
        states = capital.run_batch([{"country": c} for c in ("Peru", "Chile", "Cuba", "Laos")], backend=backend,
                                   trace=True, num_threads=2)
    finally:
        backend.shutdown()
    assert all(st["answer"] is not None for st in states)

    # A request that outlives every check below (60000 tokens), aborted by the test itself.
    long_client = server.client()
    streaming = threading.Thread(target=lambda: _drain(long_client), daemon=True)
    streaming.start()
    admin = server.client(ADMIN_KEY)
    try:
        wait_until(lambda: any(r["rid"] == "browser-long" and r["state"] == "decode"
                               for r in admin.get("/dashboard/snapshot").json()["requests"]), "the long request decodes")
        with Browser() as browser:
            browser.goto(f"{server.url}/dashboard#key={ADMIN_KEY}")
            browser.wait_for("window.__dash && window.__dash.updates >= 2", "the page gets live updates", timeout=180)
            # The shared few-shot prefix: a node the admin's view names by its text, hit by the later items.
            shared = browser.wait_for(
                "(() => { const n = __dash.view.tree.nodes.find(n => (n.text || '').includes('Capital of France')"
                " && n.hits > 0); return n && n.id; })()", "the shared prefix node shows with hits > 0")
            hits = browser.evaluate(f"Number(document.querySelector('rect[data-id=\"{shared}\"]').dataset.hits)")
            assert hits > 0
            browser.wait_for("[...document.querySelectorAll('[data-testid=request]')].some("
                             "g => g.dataset.rid === 'browser-long' && g.dataset.state === 'decode')",
                             "the running request's bar shows")
            used = browser.wait_for("Number(document.querySelector('[data-testid=pool-used]').textContent) || 0",
                                    "the pool shows usage")
            assert used > 0
            tip = _hover(browser, f'rect[data-id="{shared}"]')
            assert "Capital of France" in tip and "hits" in tip  # the admin key sees the node's text
            browser.screenshot(ARTIFACTS / "dashboard.png")

            browser.goto(f"{server.url}/dashboard/programs#key={TENANT_KEYS[0]}")
            summary = browser.wait_for("(document.querySelector('[data-testid=trace-summary]') || {}).textContent",
                                       "the program trace shows")
            assert "4 gen/select calls" in summary
            browser.evaluate("document.querySelector('rect.rt-call[data-call=\"3\"]').dispatchEvent(new MouseEvent('click'))")
            detail = browser.wait_for("document.querySelector('.rt-detail pre') && "
                                      "document.querySelector('.rt-detail').textContent", "a call's detail shows")
            assert "Capital of" in detail and "cached" in detail
            browser.screenshot(ARTIFACTS / "programs.png")
    finally:
        long_client.post("/abort_request", json={"rid": "browser-long"})
        streaming.join(120)
        long_client.close()
        admin.close()


def _drain(client: httpx.Client) -> None:
    body = {"text": "a long request", "rid": "browser-long", "sampling_params": LONG_PARAMS, "stream": True}
    try:
        with client.stream("POST", "/generate", json=body) as res:
            for _ in res.iter_lines():
                pass
    except httpx.HTTPError:
        pass
