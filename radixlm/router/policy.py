"""The router's settings and routing key; the policy itself is shared (radixlm/radix_cache/routing.py).

Runs in the router process.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.radix_cache.routing import Policy, PolicyConfig, Replica, RouteKey, new_tree

__all__ = ["Policy", "Replica", "RouteKey", "RouterConfig", "new_tree", "route_key"]


@dataclass(frozen=True)
class RouterConfig(PolicyConfig):
    health_interval_s: float = 2.0
    request_timeout_s: float = 600.0


def route_key(path: str, body: object, tenant: str) -> RouteKey:
    """The prefix a replica's cache would share: prompt text, chat messages in order, or token ids."""
    if not isinstance(body, dict):
        return RouteKey(tenant, ())
    if path == "/v1/chat/completions":
        parts = []
        for m in body.get("messages") or []:
            if isinstance(m, dict):
                content = m.get("content")
                parts.append(f"<{m.get('role')}>{content if isinstance(content, str) else content!r}")
        return RouteKey(tenant, _chars("".join(parts)))
    native = path in ("/generate", "/encode")
    prompt = body.get("text") if native else body.get("input" if path == "/v1/embeddings" else "prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch goes to one replica; its first prompt decides
    if isinstance(prompt, str):
        return RouteKey(tenant, _chars(prompt))
    ids = body.get("input_ids") if native else prompt
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        ids = ids[0]
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        # Token ids live beside characters in one tree: shift them past the Unicode range.
        return RouteKey(tenant, tuple(0x110000 + i for i in ids))
    return RouteKey(tenant, ())


def _chars(text: str) -> tuple[int, ...]:
    return tuple(map(ord, text))
