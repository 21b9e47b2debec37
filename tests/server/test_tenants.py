"""Tenant boundaries on the management routes (docs/server.md "Tenants"): a tenant key aborts only its own
requests (by rid or with abort_all); flushing the shared cache and aborting everyone's requests need the
admin key. Over HTTP on the shared server (two tenant keys and an admin key)."""

from __future__ import annotations

import asyncio
import json

import httpx

from radixlm.runtime.server.middleware import AuthMiddleware

from .conftest import ADMIN_KEY, LONG_PARAMS, TENANT_KEYS, assert_healthy, num_running, wait_until

A, B = TENANT_KEYS


def long_stream(client: httpx.Client, rid: str):
    return client.stream("POST", "/generate", json={"text": f"Tenant request {rid}", "rid": rid, "stream": True,
                                                    "sampling_params": LONG_PARAMS})


def first_event_then_final(res: httpx.Response) -> tuple[dict, dict]:
    events = [json.loads(l[6:]) for l in res.iter_lines() if l.startswith("data: {")]
    return events[0], events[-1]["meta_info"]["finish_reason"]


def test_a_tenant_aborts_only_its_own_requests(server):
    with server.client(A) as a, server.client(B) as b:
        with long_stream(a, "a-long") as res_a, long_stream(b, "b-long") as res_b:
            wait_until(lambda: num_running(server) == 2, "both requests run")
            assert b.post("/abort_request", json={"rid": "a-long"}).json() == {"aborted": False}  # not B's
            assert b.post("/abort_request", json={"abort_all": True}).status_code == 200  # B's own only
            _, final_b = first_event_then_final(res_b)
            assert final_b["type"] == "abort"
            assert a.post("/abort_request", json={"rid": "a-long"}).json() == {"aborted": True}
            _, final_a = first_event_then_final(res_a)
    # Messages on one socket arrive in order: had B's abort_all (or its rid abort) reached A's request, it
    # would have ended before A's own abort, with the scheduler's abort_all message ("aborted").
    assert final_a == {"type": "abort", "message": "aborted by request"}, final_a
    assert_healthy(server)


def test_the_admin_aborts_any_tenants_request(server):
    with server.client(A) as a, server.client(ADMIN_KEY) as admin:
        with long_stream(a, "a-admin") as res:
            wait_until(lambda: num_running(server) == 1, "the request runs")
            assert admin.post("/abort_request", json={"rid": "a-admin"}).json() == {"aborted": True}
            _, final = first_event_then_final(res)
        assert final["type"] == "abort"
        with long_stream(a, "a-admin-all") as res:
            wait_until(lambda: num_running(server) == 1, "the request runs")
            assert admin.post("/abort_request", json={"abort_all": True}).status_code == 200
            _, final = first_event_then_final(res)
        assert final == {"type": "abort", "message": "aborted"}  # the schedulers' own abort_all
    assert_healthy(server)


def test_flush_cache_needs_the_admin_key(server):
    for key in TENANT_KEYS:
        for method in ("GET", "POST"):
            res = httpx.request(method, server.url + "/flush_cache", headers=server.headers(key), timeout=30)
            assert res.status_code == 403, res.text
            err = res.json()["error"]
            assert (err["type"], err["code"]) == ("permission_error", "admin_only")
            assert "admin API key" in err["message"]
    res = httpx.post(server.url + "/flush_cache", headers=server.headers(ADMIN_KEY), timeout=30)
    assert res.status_code == 200, res.text
    assert_healthy(server)


# ---- who is an operator (no server) ---------------------------------------------------------------
def _state(keys: tuple[str, ...], admin: str | None, given: str | None) -> dict:
    seen: dict = {}

    async def app(scope, receive, send) -> None:
        seen.update(scope["state"])

    async def noop(*_):
        return {"type": "http.request"}

    headers = [(b"authorization", f"Bearer {given}".encode())] if given else []
    scope = {"type": "http", "path": "/flush_cache", "raw_path": b"/flush_cache", "headers": headers}
    asyncio.run(AuthMiddleware(app, keys, admin)(scope, noop, noop))
    return seen


def test_operator_is_the_admin_key_or_the_only_key_or_anyone_on_an_open_server():
    assert _state(("k1", "k2"), "adm", "adm")["is_operator"]
    assert not _state(("k1", "k2"), "adm", "k1")["is_operator"]
    assert not _state(("k1", "k2"), None, "k1")["is_operator"]
    assert _state(("k1",), None, "k1")["is_operator"]  # SGLang's single --api-key: no other tenant to harm
    assert not _state(("k1",), "adm", "k1")["is_operator"]  # an admin key is configured: it alone is
    assert _state((), None, None)["is_operator"]  # no keys at all: an open server
