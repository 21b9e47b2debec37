"""End to end on the real default model (SmolLM2-135M-Instruct): a server started without --model-path
answers like the in-process Engine, reports a model_path that names the family, and its chat answers
the capital question through the official openai client."""

from __future__ import annotations

import openai
import pytest

from radixlm.runtime.engine import Engine

from .conftest import TENANT_KEYS, ServerProcess

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def smol_server():
    srv = ServerProcess(None, "--served-model-name", "smollm2").wait_ready()
    yield srv
    srv.stop()
    srv.remove_tmpdir()


def test_default_model_server_matches_engine(smol_server):
    params = {"max_new_tokens": 16, "temperature": 0}
    with smol_server.client() as client:
        info = client.get("/get_model_info").json()
        got = client.post("/generate", json={"text": PROMPTS, "sampling_params": params}).json()
    assert "smollm2" in info["model_path"].lower() and info["chat_template"]
    with Engine(None, num_threads=1) as engine:
        want = engine.generate(PROMPTS, params)
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
    assert [g["text"] for g in got] == [w["text"] for w in want]


def test_default_model_chat_answers(smol_server):
    oai = openai.OpenAI(base_url=smol_server.url + "/v1", api_key=TENANT_KEYS[0], max_retries=0, timeout=120)
    res = oai.chat.completions.create(model="smollm2", temperature=0, max_tokens=24,
                                      messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in res.choices[0].message.content
    chunks = list(oai.chat.completions.create(model="smollm2", temperature=0, max_tokens=24, stream=True,
                                              messages=[{"role": "user", "content": "What is the capital of France?"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == res.choices[0].message.content


def test_default_model_embeddings_match_transformers(smol_server):
    from transformers import AutoTokenizer

    from radixlm.testing import hf_last_token_embeddings

    with smol_server.client() as client:
        model_path = client.get("/get_model_info").json()["model_path"]
    ids = [AutoTokenizer.from_pretrained(model_path)(p).input_ids for p in PROMPTS]
    oai = openai.OpenAI(base_url=smol_server.url + "/v1", api_key=TENANT_KEYS[0], max_retries=0, timeout=120)
    res = oai.embeddings.create(model="smollm2", input=PROMPTS)
    got = [d.embedding for d in res.data]
    want = hf_last_token_embeddings(model_path, ids)
    assert [len(v) for v in got] == [576, 576]  # SmolLM2-135M's hidden size
    assert max(abs(g - w) for gv, wv in zip(got, want) for g, w in zip(gv, wv)) < 1e-4
    assert res.usage.prompt_tokens == sum(len(i) for i in ids)
