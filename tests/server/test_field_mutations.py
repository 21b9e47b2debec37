"""Every field of every JSON route, replaced by a value of each other JSON type: the answer is the route's own
4xx (or a 200 where the value happens to be valid), never a 5xx, and the server stays healthy. The bodies are
valid to start with, so each request tests one field."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from .conftest import assert_healthy

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
BODIES: dict[str, dict[str, Any]] = {
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2, "echo": True, "logprobs": 1},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                             "tools": [{"type": "function", "function": {"name": "w", "parameters": WEATHER}}],
                             "tool_choice": "auto"},
    "/v1/responses": {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                      "instructions": "be brief", "max_output_tokens": 2,
                      "tools": [{"type": "function", "name": "w", "parameters": WEATHER}],
                      "text": {"format": {"type": "text"}}},
    "/v1/messages": {"model": "served", "max_tokens": 2, "system": [{"type": "text", "text": "be brief"}],
                     "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                     "tools": [{"name": "w", "input_schema": WEATHER}], "tool_choice": {"type": "auto"}},
    "/v1/messages/count_tokens": {"model": "served", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/embeddings": {"input": ["hi", "there"], "encoding_format": "float"},
    "/tokenize": {"prompt": "hi", "add_special_tokens": True},
    "/detokenize": {"tokens": [1, 2]},
}
MUTANTS: list[Any] = [None, True, -1, 1e308, "x", [], [1, "a"], {}, {"a": [None]}]


def _paths(value: Any, at: tuple = ()) -> Iterator[tuple]:
    """Every path into a JSON value (keys and list indices), the value itself first."""
    if at:
        yield at
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*at, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _paths(child, (*at, i))


def _replaced(body: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(body, dict):
        return {**body, head: _replaced(body[head], rest, new)}
    return [_replaced(v, rest, new) if i == head else v for i, v in enumerate(body)]


CASES = [(route, path) for route, body in BODIES.items() for path in _paths(body)]


@pytest.mark.parametrize("route, path", CASES, ids=[f"{r}:{'.'.join(map(str, p))}" for r, p in CASES])
def test_a_field_of_another_type_is_never_a_5xx(client, server, route, path):
    body = BODIES[route]
    if "model" in body:  # Anthropic's model is required: the served one (an unknown name is a 404)
        body = {**body, "model": client.get("/v1/models").json()["data"][0]["id"]}
    statuses = set()
    for mutant in MUTANTS:
        res = client.post(route, json=_replaced(body, path, mutant))
        assert res.status_code < 500, (mutant, res.status_code, res.text[:300])
        statuses.add(res.status_code)
    assert statuses <= {200, 400, 404, 413, 422}, statuses


def test_the_server_is_healthy_after_the_mutations(server):
    assert_healthy(server)
