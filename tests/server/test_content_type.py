"""Content types (docs/server.md "Errors"): the body is always parsed as JSON; no Content-Type, JSON types,
text/plain and form-urlencoded (what `curl -d` sends) are accepted; anything else is a 400."""

from __future__ import annotations

import json

import pytest

from .conftest import assert_healthy

BODIES = {"/generate": {"text": "Hi", "sampling_params": {"max_new_tokens": 1}},
          "/v1/completions": {"prompt": "Hi", "max_tokens": 1}}
ACCEPTED = [None, "application/json", "application/json; charset=utf-8", "application/vnd.api+json",
            "text/plain", "application/x-www-form-urlencoded"]
REJECTED = ["multipart/form-data; boundary=x", "application/xml", "application/octet-stream", "text/html"]


@pytest.mark.parametrize("ctype", ACCEPTED)
def test_json_bodies_under_accepted_content_types(client, ctype):
    for path, body in BODIES.items():
        headers = {} if ctype is None else {"content-type": ctype}
        res = client.post(path, content=json.dumps(body).encode(), headers=headers)
        assert res.status_code == 200, (path, ctype, res.text)


@pytest.mark.parametrize("ctype", REJECTED)
def test_other_content_types_are_a_400(client, server, ctype):
    for path, body in BODIES.items():
        res = client.post(path, content=json.dumps(body).encode(), headers={"content-type": ctype})
        assert res.status_code == 400, (path, ctype, res.text)
        assert res.json()["error"]["code"] == "invalid_content_type"
    assert_healthy(server)
