"""/openapi.json and /docs: the native and OpenAI routes with their request bodies (the
msgspec Structs of server/bodies.py), a Swagger UI page whose assets the server serves itself (no CDN),
and all of it behind the API key like every read-only route."""

from __future__ import annotations

import re

import httpx
import pytest

from .conftest import ADMIN_KEY, TENANT_KEYS

DOC_PATHS = ("/openapi.json", "/docs", "/docs/assets/swagger-ui-bundle.js")


def _body_schema(spec: dict, path: str) -> dict:
    ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return spec["components"]["schemas"][ref.rsplit("/", 1)[1]]


def _resolve(spec: dict, schema: dict) -> list[dict]:
    """The object schemas a field schema may be (through $ref and anyOf)."""
    if "$ref" in schema:
        return _resolve(spec, spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]])
    if "anyOf" in schema:
        return [s for option in schema["anyOf"] for s in _resolve(spec, option)]
    return [schema]


def test_openapi_lists_the_routes_with_their_request_bodies(client):
    res = client.get("/openapi.json")
    assert res.status_code == 200
    spec = res.json()
    assert spec["openapi"].startswith("3.")
    for path in ("/generate", "/v1/chat/completions", "/v1/completions"):
        assert path in spec["paths"], sorted(spec["paths"])
    for path in ("/v1/models", "/health", "/get_model_info", "/abort_request"):
        assert path in spec["paths"]
    chat, completion = _body_schema(spec, "/v1/chat/completions"), _body_schema(spec, "/v1/completions")
    for body, fields in ((chat, ("messages", "temperature", "max_tokens", "tools", "response_format", "stream")),
                         (completion, ("prompt", "temperature", "max_tokens", "logprobs", "echo"))):
        assert set(fields) <= set(body["properties"]), sorted(body["properties"])
        assert {"type": "number"} in body["properties"]["temperature"]["anyOf"]
    generate = _body_schema(spec, "/generate")
    assert {"text", "input_ids", "sampling_params", "stream"} <= set(generate["properties"])
    sampling = [s for s in _resolve(spec, generate["properties"]["sampling_params"]) if s.get("type") == "object"]
    assert sampling and {"temperature", "max_new_tokens", "json_schema", "stop"} <= set(sampling[0]["properties"])
    assert sampling[0]["additionalProperties"] is False  # an unknown sampling parameter is a 400
    assert spec["paths"]["/v1/models"]["get"]  # the GET routes are listed too


def test_docs_page_is_served_offline(client):
    page = client.get("/docs")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assert urls and all(u.startswith("/") for u in urls), urls  # nothing from another host (no CDN)
    assert "/openapi.json" in page.text
    for url in urls:
        asset = client.get(url)
        assert asset.status_code == 200 and asset.content, url
    assert "SwaggerUIBundle" in client.get("/docs/assets/swagger-ui-bundle.js").text


@pytest.mark.parametrize("path", DOC_PATHS)
def test_docs_need_a_key(server, path):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        res = httpx.get(server.url + path, headers=headers, timeout=10)
        assert res.status_code == 401 and res.json()["error"]["type"] == "authentication_error"
    for key in (TENANT_KEYS[1], ADMIN_KEY):  # any tenant's key, like the other read-only routes
        assert httpx.get(server.url + path, headers=server.headers(key), timeout=30).status_code == 200
