"""POST /v1/embeddings through the official openai client (and /encode, SGLang's native route) on the tiny-model
server: float and base64 agree, a batch equals its prompts one by one, token ids equal text, the vectors equal
transformers' last-token pooling, a repeated prompt is served from the radix cache, and bad input is a 400 in
OpenAI's error shape with the server left clean."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
import transformers

from radixlm.testing import hf_last_token_embeddings

from .conftest import TENANT_KEYS, assert_healthy

TEXTS = ["Paris", "The quick brown fox jumps over the lazy dog", "Question: What is two plus two? Answer: four"]
LONG = "A radix tree shares every common prefix of the prompts it holds, so repeated work is skipped. " * 4
HIDDEN = 64  # the tiny checkpoints' hidden size
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    return transformers.AutoTokenizer.from_pretrained(tiny_llama_dir)


def _vectors(res) -> np.ndarray:
    assert [d.index for d in res.data] == list(range(len(res.data)))
    return np.array([d.embedding for d in res.data], dtype=np.float64)


def _close(a, b) -> bool:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)))) < TOLERANCE


def test_openai_client_batch_matches_transformers(model, oai, tiny_llama_dir, tokenizer):
    res = oai.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    got = _vectors(res)
    assert res.object == "list" and res.model == model and got.shape == (len(TEXTS), HIDDEN)
    ids = [tokenizer(t).input_ids for t in TEXTS]
    assert res.usage.prompt_tokens == res.usage.total_tokens == sum(len(i) for i in ids)
    assert _close(got, hf_last_token_embeddings(tiny_llama_dir, ids))
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    one_by_one = [_vectors(oai.embeddings.create(model=model, input=t))[0] for t in reversed(TEXTS)]
    assert _close(got, one_by_one[::-1])
    by_ids = _vectors(oai.embeddings.create(model=model, input=ids))
    assert _close(got, by_ids)
    assert _close(got[1], _vectors(oai.embeddings.create(model=model, input=ids[1]))[0])


def test_base64_is_the_float_vector(model, oai, client):
    # The openai client asks for base64 when no format is given and decodes it itself.
    default = _vectors(oai.embeddings.create(model=model, input=TEXTS[:2]))
    floats = client.post("/v1/embeddings", json={"input": TEXTS[:2]}).json()  # float is the default
    raw = client.post("/v1/embeddings", json={"input": TEXTS[:2], "encoding_format": "base64",
                                              "dimensions": HIDDEN, "user": "someone"}).json()
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw["data"]]
    assert [d["object"] for d in raw["data"]] == ["embedding", "embedding"]
    assert np.array_equal(np.array(decoded), np.array([d["embedding"] for d in floats["data"]], dtype=np.float32))
    assert _close(default, decoded)


def test_a_repeated_prompt_is_served_from_the_cache(model, oai):
    first = oai.embeddings.create(model=model, input=LONG, encoding_format="float")
    again = oai.embeddings.create(model=model, input=LONG, encoding_format="float")
    n = first.usage.prompt_tokens
    assert n > 30
    assert again.usage.prompt_tokens_details["cached_tokens"] == n - 1  # only the last token is computed again
    assert _close(_vectors(first), _vectors(again))
    gen = oai.completions.create(model=model, prompt=LONG, max_tokens=2, temperature=0)
    assert gen.usage.prompt_tokens_details.cached_tokens == n - 1  # generation reuses the embedding's prefix


def test_native_encode(model, client, oai):
    one = client.post("/encode", json={"text": TEXTS[0]}).json()
    batch = client.post("/encode", json={"text": TEXTS}).json()
    assert len(one["embedding"]) == HIDDEN and one["meta_info"]["prompt_tokens"] > 0
    assert [len(b["embedding"]) for b in batch] == [HIDDEN] * len(TEXTS)
    want = _vectors(oai.embeddings.create(model=model, input=TEXTS, encoding_format="float"))
    assert _close([b["embedding"] for b in batch], want) and _close(one["embedding"], want[0])


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["a", ""]}, "input"),
    ({"input": [[1, 2], []]}, "input"),
    ({"input": ["a", 5]}, "input"),
    ({"input": 5}, "input"),
    ({"input": [1.5]}, "input"),
    ({}, "input"),
    ({"input": [10 ** 9]}, "input"),
    ({"input": "a", "dimensions": 8}, "dimensions"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "a", "user": 3}, "user"),
])
def test_bad_input_is_a_400_in_openai_shape(client, body, param):
    res = client.post("/v1/embeddings", json=body)
    assert res.status_code == 400, res.text
    err = res.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"], err


def test_too_long_input_and_openai_client_errors(model, oai, client, server):
    res = client.post("/v1/embeddings", json={"input": [5] * 65537})  # the server's context is 65536
    assert res.status_code == 400 and res.json()["error"]["code"] == "context_length_exceeded", res.text
    assert res.json()["error"]["param"] == "input"
    with pytest.raises(openai.BadRequestError) as exc:
        oai.embeddings.create(model=model, input="a", dimensions=8)
    assert exc.value.body["param"] == "dimensions"
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="no-such-model", input="a")
    assert client.post("/encode", json={"text": ""}).status_code == 400
    assert_healthy(server)  # idle invariants (no leaked KV slot), same pids, canary unchanged


def test_needs_an_api_key(model, server):
    bare = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        bare.embeddings.create(model=model, input="a")
    res = httpx.post(server.url + "/encode", json={"text": "a"}, timeout=60)
    assert res.status_code == 401 and res.json()["error"]["type"] == "authentication_error"


def test_tenants_never_share_cached_prompts(server):
    body = {"input": "Only tenant A has embedded this sentence so far, long enough to be cached."}
    with server.client(TENANT_KEYS[0]) as a, server.client(TENANT_KEYS[1]) as b:
        a.post("/v1/embeddings", json=body)
        assert a.post("/v1/embeddings", json=body).json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert b.post("/v1/embeddings", json=body).json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_listed_in_openapi(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert "post" in paths["/v1/embeddings"] and "post" in paths["/encode"]
