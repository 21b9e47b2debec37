"""Routing decisions of the cache-aware and round-robin policies (no servers)."""

from __future__ import annotations

from radixlm.router.policy import Policy, RouterConfig, route_key

URLS = ("http://a", "http://b")
PREFIXES = [f"System prompt of tenant {t}: " + "x" * 40 + f" rules {t} " * 5 for t in "PQR"]


def _workload(rounds: int = 4) -> list[tuple[int, str]]:
    return [(t, PREFIXES[t] + f"question {i}") for i in range(rounds) for t in range(3)]


def test_cache_aware_keeps_each_prefix_on_one_replica():
    policy = Policy(RouterConfig(URLS))
    where: dict[int, set[str]] = {0: set(), 1: set(), 2: set()}
    for tenant, text in _workload():
        where[tenant].add(policy.choose(route_key("/generate", {"text": text}, "")).url)
    assert all(len(urls) == 1 for urls in where.values())
    assert set.union(*where.values()) == set(URLS)  # new prefixes start on the emptier replica


def test_round_robin_alternates_and_scatters_prefixes():
    policy = Policy(RouterConfig(URLS, policy="round_robin"))
    chosen = [policy.choose(route_key("/generate", {"text": text}, "")).url for _, text in _workload()]
    assert chosen == [URLS[i % 2] for i in range(len(chosen))]


def test_uneven_load_overrides_cache():
    policy = Policy(RouterConfig(URLS, balance_abs_threshold=4, balance_rel_threshold=1.5))
    key = route_key("/generate", {"text": PREFIXES[0] + "q"}, "")
    first = policy.choose(key)
    first.load = 3  # within the thresholds: the cache wins
    assert policy.choose(key).url == first.url
    first.load = 10  # busy with 10 requests, the other replica idle: balance wins
    assert policy.choose(key).url != first.url


def test_tenants_do_not_share_prefixes():
    policy = Policy(RouterConfig(URLS))
    a = policy.choose(route_key("/generate", {"text": PREFIXES[0]}, "Bearer k1"))
    b = policy.choose(route_key("/generate", {"text": PREFIXES[0]}, "Bearer k2"))
    assert a.url != b.url  # k2 has no cached prefix anywhere: it starts on the emptier replica


def test_unhealthy_replicas_are_skipped():
    policy = Policy(RouterConfig(URLS))
    key = route_key("/generate", {"text": "hello"}, "")
    first = policy.choose(key)
    policy.mark(first, False)
    assert policy.choose(key).url != first.url
    assert policy.choose(key, exclude=frozenset(URLS)) is None
    policy.mark(first, True)
    assert first.tree.total_size() == 0  # a replica that comes back is assumed to have lost its cache


def test_tree_is_bounded():
    policy = Policy(RouterConfig(URLS[:1], max_tree_chars=500))
    for i in range(50):
        policy.choose(route_key("/generate", {"text": f"{i} distinct prompt number {i} " * 3}, ""))
        policy.replicas[0].tree.check_integrity()
        assert policy.replicas[0].tree.total_size() <= 500 + 80  # whole nodes go: at most one key over


def test_route_keys_follow_the_prefix():
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    k1 = route_key("/v1/chat/completions", {"messages": chat}, "")
    k2 = route_key("/v1/chat/completions", {"messages": chat + [{"role": "assistant", "content": "yo"}]}, "")
    assert k2.ids[: len(k1.ids)] == k1.ids
    assert route_key("/v1/completions", {"prompt": ["abc", "d"]}, "").ids == tuple(map(ord, "abc"))
    ids = route_key("/generate", {"input_ids": [[5, 6], [7]]}, "").ids
    assert len(ids) == 2 and min(ids) > 0x10FFFF  # token ids never collide with characters
    assert route_key("/generate", "not a dict", "").ids == ()
    # Embeddings share the generation routes' prefixes (one radix cache serves both on a replica).
    assert route_key("/v1/embeddings", {"input": ["abc", "d"]}, "").ids == tuple(map(ord, "abc"))
    assert route_key("/encode", {"text": "abc"}, "").ids == tuple(map(ord, "abc"))
    assert route_key("/v1/embeddings", {"input": [[5, 6], [7]]}, "").ids == ids
