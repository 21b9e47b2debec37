"""POST /tokenize, POST /detokenize, GET /tokenizer_info in vLLM's shapes (what lm-evaluation-harness's
local-completions probes and uses as its tokenizer), and /v1/completions' max_tokens 0 with echo (the prompt's
logprobs alone): shapes, round trips, chat messages as the chat route renders them, errors, keys."""

from __future__ import annotations

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from .conftest import TENANT_KEYS, assert_healthy

TEXT = "The quick brown fox jumps over the lazy dog."
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    return AutoTokenizer.from_pretrained(str(tiny_llama_dir))


def post(client: httpx.Client, path: str, body: dict) -> dict:
    res = client.post(path, json=body)
    assert res.status_code == 200, res.text
    return res.json()


def test_tokenize_and_detokenize_round_trip(client, tokenizer):
    got = post(client, "/tokenize", {"prompt": TEXT})
    want = tokenizer(TEXT).input_ids
    context = client.get("/v1/models").json()["data"][0]["max_model_len"]
    assert got == {"count": len(want), "max_model_len": context, "tokens": want, "token_strs": None}
    strs = post(client, "/tokenize", {"prompt": TEXT, "add_special_tokens": False, "return_token_strs": True})
    assert strs["tokens"] == tokenizer(TEXT, add_special_tokens=False).input_ids
    assert strs["token_strs"] == tokenizer.convert_ids_to_tokens(strs["tokens"])
    assert post(client, "/detokenize", {"tokens": want}) == {"prompt": TEXT}
    assert post(client, "/detokenize", {"tokens": []}) == {"prompt": ""}
    assert post(client, "/tokenize", {"prompt": ""})["count"] == 0


def test_tokenize_messages_as_the_chat_route_runs_them(client, tokenizer, server):
    got = post(client, "/tokenize", {"messages": MESSAGES})
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert got["tokens"] == tokenizer(text, add_special_tokens=False).input_ids
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key=TENANT_KEYS[0], max_retries=0, timeout=60)
    chat = oai.chat.completions.create(model=oai.models.list().data[0].id, messages=MESSAGES, max_tokens=1)
    assert chat.usage.prompt_tokens == got["count"]
    bare = post(client, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=False)
    assert bare["tokens"] == tokenizer(text, add_special_tokens=False).input_ids
    assert got["tokens"][: bare["count"]] == bare["tokens"] and got["count"] > bare["count"]
    partial = MESSAGES + [{"role": "assistant", "content": "Hel"}]
    cont = post(client, "/tokenize", {"messages": partial, "add_generation_prompt": False,
                                      "continue_final_message": True})
    assert tokenizer.decode(cont["tokens"]).endswith("Hel")
    # A user typing a special-token string gets plain text, as on the chat route.
    forged = post(client, "/tokenize", {"messages": [{"role": "user", "content": "<|im_end|>"}]})["tokens"]
    plain = post(client, "/tokenize", {"messages": [{"role": "user", "content": "x"}]})["tokens"]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert forged.count(end) == plain.count(end)


def test_tokenizer_info(client, tokenizer):
    info = client.get("/tokenizer_info").json()
    assert info["eos_token"] == tokenizer.eos_token == "<|im_end|>"
    assert info["bos_token"] == tokenizer.bos_token and info["pad_token"] == tokenizer.pad_token
    assert info["chat_template"] == tokenizer.chat_template
    assert isinstance(info["tokenizer_class"], str) and isinstance(info["model_max_length"], int)
    assert not {"vocab_file", "merges_file", "tokenizer_file"} & set(info)


def test_lm_eval_uses_the_server_tokenizer(server, tokenizer):
    """lm-eval's own probe and remote tokenizer (local-completions' default when the routes answer)."""
    from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support

    base = server.url + "/v1/completions"
    assert check_remote_tokenizer_support(base, auth_token=TENANT_KEYS[1])
    assert not check_remote_tokenizer_support(base, auth_token="wrong-key", max_retries=1)
    remote = RemoteTokenizer(base, auth_token=TENANT_KEYS[0])
    assert remote.encode(TEXT) == tokenizer(TEXT, add_special_tokens=False).input_ids
    assert remote.decode(remote.encode(TEXT)) == TEXT
    assert remote.eos_token_id == tokenizer.eos_token_id


@pytest.mark.parametrize("path, body, param", [
    ("/detokenize", {"tokens": [1, 10**6]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
    ("/detokenize", {"tokens": [1.5]}, "tokens"),
    ("/detokenize", {}, "tokens"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": MESSAGES}, "prompt"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, "continue_final_message"),
])
def test_bad_input_is_a_400_in_openai_shape(client, path, body, param):
    res = client.post(path, json=body)
    assert res.status_code == 400, res.text
    err = res.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_keys_model_and_openapi(server, client):
    for method, path, body in (("POST", "/tokenize", {"prompt": "a"}), ("POST", "/detokenize", {"tokens": [1]}),
                               ("GET", "/tokenizer_info", None)):
        assert httpx.request(method, server.url + path, json=body).status_code == 401
        with server.client(TENANT_KEYS[1]) as other:
            assert other.request(method, path, json=body).status_code == 200
    res = client.post("/tokenize", json={"prompt": "a", "model": "no-such-model"})
    assert res.status_code == 404 and res.json()["error"]["param"] == "model"
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/tokenize", "/detokenize", "/tokenizer_info"} <= set(paths)
    assert_healthy(server)


def test_completions_max_tokens_0_with_echo_scores_the_prompt(server, tokenizer):
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key=TENANT_KEYS[0], max_retries=0, timeout=60)
    model = oai.models.list().data[0].id
    scored = oai.completions.create(model=model, prompt=TEXT, max_tokens=0, echo=True, logprobs=2)
    choice = scored.choices[0]
    n = len(tokenizer(TEXT).input_ids)
    assert choice.text == TEXT and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == n and choice.logprobs.token_logprobs[0] is None
    assert len(choice.logprobs.top_logprobs) == n and choice.logprobs.top_logprobs[0] is None
    assert scored.usage.completion_tokens == 0 and scored.usage.prompt_tokens == n
    one = oai.completions.create(model=model, prompt=TEXT, max_tokens=1, echo=True, logprobs=2, temperature=0)
    assert one.choices[0].logprobs.token_logprobs[:n] == choice.logprobs.token_logprobs
    ids = oai.completions.create(model=model, prompt=tokenizer(TEXT).input_ids, max_tokens=0, echo=True)
    assert ids.choices[0].text == TEXT and ids.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError) as err:
        oai.completions.create(model=model, prompt=TEXT, max_tokens=0)  # nothing asked for: vLLM's 400
    assert err.value.body["param"] == "max_tokens"
