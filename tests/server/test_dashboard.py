"""The dashboard's data: the scheduler's tree snapshot matches the RadixCache (with folding past
the node cap), hit counts keep the tree's invariants, the page's view shows text only to the admin key and
namespaces only as opaque ids, and the routes enforce the keys with OpenAI-style 401/403 bodies."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest
import torch

from radixlm.radix_cache import RadixCache
from radixlm.radix_cache.tree_node import subtree
from radixlm.runtime.messages import ControlResp
from radixlm.runtime.scheduler.dashboard import SnapshotBuilder, tree_view

from .conftest import ADMIN_KEY, LONG_PARAMS, TENANT_KEYS, wait_until


class _Slots:
    def __init__(self) -> None:
        self.next = 1
        self.freed: list[int] = []

    def take(self, n: int) -> torch.Tensor:
        out = torch.arange(self.next, self.next + n, dtype=torch.int64)
        self.next += n
        return out


def _tree() -> tuple[RadixCache, _Slots]:
    slots = _Slots()
    tree = RadixCache(lambda s: slots.freed.extend(s.tolist()))
    return tree, slots


def _insert(tree: RadixCache, slots: _Slots, ns: str, ids: list[int]) -> None:
    tree.insert(ns, ids, slots.take(len(ids)))


def _hit(tree: RadixCache, ns: str, ids: list[int]) -> None:
    """What the scheduler does when it admits a request with a cached prefix."""
    match = tree.match_prefix(ns, ids)
    tree.inc_lock_ref(match.last_node)
    tree.record_hit(match.last_node)
    tree.dec_lock_ref(match.last_node)


# ---- the scheduler's snapshot of the tree ---------------------------------------------------------
def test_tree_view_matches_the_radix_cache():
    tree, slots = _tree()
    shared = list(range(100, 140))
    for tail in ([1, 2, 3], [4, 5], [6]):
        _insert(tree, slots, "", shared + tail)
    _insert(tree, slots, "tenant", [7, 8, 9])
    _hit(tree, "", shared + [4, 5])
    _hit(tree, "", shared + [9])  # a partial match: splits nothing new, hits the shared node
    tree.check_integrity()  # hit counts keep the invariants (hit_count >= sum of the children's)
    view = tree_view(tree, max_nodes=100, now=0.0)
    real = {n.node_id: n for ns in tree.namespaces() for n in subtree(tree.root(ns))}
    assert {n["id"] for n in view["nodes"]} == set(real) and view["num_nodes"] == len(real)
    by_id = {n["id"]: n for n in view["nodes"]}
    for node in view["nodes"]:
        actual = real[node["id"]]
        parent = actual.parent
        assert node["parent"] == (-1 if parent.is_root else parent.node_id)
        assert node["len"] == len(actual.key) and node["lock"] == actual.lock_ref and node["ns"] == actual.namespace
        assert node["hits"] == actual.hit_count and node["tokens"] == list(actual.key[:48])
        if node["parent"] != -1:
            assert view["nodes"].index(by_id[node["parent"]]) < view["nodes"].index(node)  # parents first
    shared_node = next(n for n in view["nodes"] if n["len"] == 40)
    assert shared_node["hits"] == 2 and shared_node["subtree"] == 40 + 3 + 2 + 1
    assert next(n for n in view["nodes"] if n["tokens"] == [4, 5])["hits"] == 1


def test_a_split_keeps_the_hits_and_eviction_removes_nodes():
    tree, slots = _tree()
    _insert(tree, slots, "", [1, 2, 3, 4])
    _hit(tree, "", [1, 2, 3, 4])
    _insert(tree, slots, "", [1, 2, 9])  # splits [1,2,3,4] into [1,2] + [3,4]
    tree.check_integrity()
    view = {tuple(n["tokens"]): n for n in tree_view(tree, 100, 0.0)["nodes"]}
    assert view[(1, 2)]["hits"] == 1 and view[(3, 4)]["hits"] == 1 and view[(9,)]["hits"] == 0
    tree.evict(100)
    assert tree_view(tree, 100, 0.0)["nodes"] == []


def test_past_the_cap_the_smallest_subtrees_fold():
    tree, slots = _tree()
    for i in range(30):  # 30 leaves of growing size under one shared node
        _insert(tree, slots, "", [1000] * 5 + [i] * (i + 1))
    view = tree_view(tree, max_nodes=10, now=0.0)
    nodes = view["nodes"]
    assert len(nodes) == 10 and view["num_nodes"] == 31
    ids = {n["id"] for n in nodes}
    assert all(n["parent"] == -1 or n["parent"] in ids for n in nodes)  # what is shown stays connected
    root = next(n for n in nodes if n["parent"] == -1)
    kept = sorted(n["len"] for n in nodes if n["parent"] == root["id"])
    assert kept == list(range(22, 31))  # the largest subtrees are shown
    assert root["folded_nodes"] == 21 and root["folded_tokens"] == sum(range(1, 22))


def test_snapshots_are_rate_limited():
    tree, slots = _tree()
    _insert(tree, slots, "", [1, 2, 3])
    sched = SimpleNamespace(
        kv=SimpleNamespace(tree=tree, allocator=SimpleNamespace(size=100, num_free=lambda: 97)),
        grammar=SimpleNamespace(_pending=[]), waiting=[], running=[], num_forward_steps=0, num_computed_tokens=0,
        stats=SimpleNamespace(to_dict=lambda: {"num_retractions": 0, "prompt_tokens": 0, "cached_tokens": 0}))
    builder = SnapshotBuilder(min_interval_s=3600)
    first = builder.snapshot(sched)
    assert builder.snapshot(sched) is first and builder.num_builds == 1
    assert first["pool"] == {"total": 100, "free": 97, "evictable": 3, "locked": 0, "used": 0}


def test_a_slow_build_spaces_the_next_ones_out(monkeypatch):
    """Builds take at most BUDGET of the scheduler's time: after a 0.1 s build the next one waits 0.1 / BUDGET."""
    import radixlm.runtime.scheduler.dashboard as dash

    clock = [100.0]

    def slow_build(scheduler, max_nodes):
        clock[0] += 0.1
        return {"n": clock[0]}

    monkeypatch.setattr(dash.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(dash, "build_snapshot", slow_build)
    builder = dash.SnapshotBuilder(min_interval_s=0.2)
    first = builder.snapshot(None)
    clock[0] += 0.1 / dash.BUDGET - 1.0
    assert builder.snapshot(None) is first
    clock[0] += 2.0
    assert builder.snapshot(None) is not first and builder.num_builds == 2
    assert builder.build_seconds == pytest.approx(0.2)


# ---- the HTTP side's view (hub.py) with a canned scheduler answer -----------------------------------
class _FakeTokenizer:
    def batch_decode(self, seqs):
        return ["<" + " ".join(map(str, s)) + ">" for s in seqs]


def _hub_with(tree: RadixCache):
    from radixlm.runtime.server.dashboard.hub import DashboardHub

    snap = {"pool": {"total": 100, "free": 90, "evictable": 6, "locked": 4, "used": 4},
            "tree": tree_view(tree, 100, 0.0), "requests": [],
            "counters": {"num_retractions": 0, "prompt_tokens": 10, "cached_tokens": 5, "num_requests": 2}}

    async def control_ranks(kind, timeout=10.0):
        assert kind == "dashboard_snapshot"
        return (ControlResp("x", True, snap),)

    tm = SimpleNamespace(control_ranks=control_ranks, handles={}, tokenizer=_FakeTokenizer())
    return DashboardHub(tm)


def test_text_only_for_the_admin_and_namespaces_opaque():
    tree, slots = _tree()
    tenant_ns = "0123456789abcdef"  # a tenant's namespace is derived from its key: never shown as is
    _insert(tree, slots, tenant_ns, [5, 6, 7])
    _insert(tree, slots, "", [8, 9])
    hub = _hub_with(tree)

    async def views():
        await hub.refresh()
        return await hub.view(False), await hub.view(True)

    public, admin = asyncio.run(views())
    assert all("text" not in n for n in public["tree"]["nodes"])
    assert "5 6 7" not in json.dumps(public) and tenant_ns not in json.dumps(public)
    assert sorted(n["ns"] for n in public["tree"]["nodes"])[0] == "default"
    opaque = next(n["ns"] for n in public["tree"]["nodes"] if n["ns"] != "default")
    assert opaque.startswith("ns-") and opaque not in tenant_ns
    assert sorted(n["text"] for n in admin["tree"]["nodes"]) == ["<5 6 7>", "<8 9>"]
    assert tenant_ns not in json.dumps(admin)  # opaque for the admin too
    assert public["pool"]["used"] == 4 and public["counters"]["hit_rate"] == 0.5


def test_request_timeline_segments():
    from radixlm.runtime.server.dashboard.timeline import RequestRecord

    rec = RequestRecord("r", "", t0=0.0)
    view = {"state": "grammar", "retractions": 0, "jump_forward": 0, "prompt": 10, "cached": 4, "out": 0}
    rec.observe(view, 1.0)
    rec.observe({**view, "state": "queued"}, 2.0)
    rec.observe({**view, "state": "prefill"}, 3.0)
    rec.t_first = 4.0
    rec.observe({**view, "state": "decode", "retractions": 1, "jump_forward": 5}, 5.0)
    rec.t_end = 6.0
    assert rec.segments(9.0) == [("grammar", 0.0, 2.0), ("queued", 2.0, 3.0), ("prefill", 3.0, 4.0),
                                 ("decode", 4.0, 6.0)]
    assert rec.marks == [("retraction", 5.0), ("jump_forward", 5.0)]


# ---- the routes on a real server (keys: two tenants and an admin) -----------------------------------
def _error(res: httpx.Response, status: int, type_: str) -> None:
    assert res.status_code == status, res.text
    err = res.json()["error"]
    assert err["type"] == type_ and err["message"]


@pytest.mark.parametrize("path", ["/dashboard/snapshot", "/dashboard/events"])
def test_data_routes_need_the_admin_key(server, path):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        _error(httpx.get(server.url + path, headers=headers, timeout=30), 401, "authentication_error")
    _error(httpx.get(server.url + path, headers=server.headers(TENANT_KEYS[0]), timeout=30), 403, "permission_error")


def test_page_shells_are_public_and_hold_no_data(server):
    for path in ("/dashboard", "/dashboard/programs", "/dashboard/assets/dashboard.js",
                 "/dashboard/assets/trace.js", "/dashboard/assets/dashboard.css"):
        res = httpx.get(server.url + path, timeout=30)
        assert res.status_code == 200 and res.content, path
    page = httpx.get(server.url + "/dashboard", timeout=30).text
    assert "http://" not in page and "https://" not in page  # no CDN: works offline
    _error(httpx.get(server.url + "/dashboard/assets/../admin.py", timeout=30), 401, "authentication_error")
    _error(httpx.get(server.url + "/dashboard/assets/nope.js", headers=server.headers(ADMIN_KEY), timeout=30),
           404, "invalid_request_error")


def test_snapshot_shows_the_shared_prefix_and_a_running_request(server):
    prefix = "Shared dashboard prefix: " + "alpha beta gamma delta " * 8
    with server.client() as c:
        for q in ("one", "two", "three"):
            assert c.post("/generate", json={"text": prefix + q, "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    admin = server.client(ADMIN_KEY)
    with server.client() as c, c.stream("POST", "/generate", json={"text": "long one", "rid": "dash-long",
                                                                     "sampling_params": LONG_PARAMS, "stream": True}):
        try:
            view = wait_until(lambda: (v := admin.get("/dashboard/snapshot").json()) and any(
                r["rid"] == "dash-long" and r["state"] == "decode" for r in v["requests"]) and v,
                "the long request decodes")
        finally:
            c.post("/abort_request", json={"rid": "dash-long"})
    shared = [n for n in view["tree"]["nodes"] if n["hits"] > 0 and "alpha beta gamma" in n.get("text", "")]
    assert shared, view["tree"]["nodes"]
    assert view["pool"]["used"] > 0 and view["is_admin"]
    long = next(r for r in view["requests"] if r["rid"] == "dash-long")
    assert [s[0] for s in long["segments"]][-1] == "decode"
    assert all(n["ns"] in ("default",) or n["ns"].startswith("ns-") for n in view["tree"]["nodes"])
    admin.close()


def test_events_stream_sends_views(server):
    with httpx.stream("GET", server.url + "/dashboard/events", headers=server.headers(ADMIN_KEY), timeout=60) as res:
        assert res.status_code == 200 and res.headers["content-type"].startswith("text/event-stream")
        for line in res.iter_lines():
            if line.startswith("data: "):
                view = json.loads(line[6:])
                assert {"tree", "pool", "requests", "rates", "pool_history"} <= set(view)
                break


def test_program_traces_are_per_tenant(server):
    from radixlm.lang.program_trace import TraceRecorder
    from radixlm.trace.schema import encode_trace

    trace = TraceRecorder("tenant_a_program").export()
    a, b, admin = (server.client(k) for k in (*TENANT_KEYS, ADMIN_KEY))
    try:
        posted = a.post("/dashboard/programs/traces", content=encode_trace(trace))
        assert posted.status_code == 200 and posted.json()["id"] == trace.id
        assert trace.id in [t["id"] for t in a.get("/dashboard/programs/traces").json()["traces"]]
        assert a.get(f"/dashboard/programs/traces/{trace.id}").json()["name"] == "tenant_a_program"
        assert trace.id not in [t["id"] for t in b.get("/dashboard/programs/traces").json()["traces"]]
        _error(b.get(f"/dashboard/programs/traces/{trace.id}"), 404, "invalid_request_error")
        assert admin.get(f"/dashboard/programs/traces/{trace.id}").status_code == 200
        _error(a.post("/dashboard/programs/traces", content=b'{"name": 1}'), 400, "invalid_request_error")
        _error(a.post("/dashboard/programs/traces", content=b"not json"), 400, "invalid_request_error")
        _error(httpx.get(server.url + "/dashboard/programs/traces", timeout=30), 401, "authentication_error")
    finally:
        for c in (a, b, admin):
            c.close()
