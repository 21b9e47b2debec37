"""lm-evaluation-harness against the server: `local-completions` with its default tokenizer detection (it finds
/tokenizer_info and /tokenize and uses the server's tokenizer), on small offline tasks of each request type
(multiple choice, rolling perplexity, generation), gives lm-eval's `hf` results on the same SmolLM2 weights;
the 5-shot multiple-choice run is served from the radix cache (echo + logprobs requests reuse the shared
few-shot prefix with its logprobs)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from .conftest import TENANT_KEYS, ServerProcess

pytestmark = pytest.mark.slow

KEY = TENANT_KEYS[0]
FEWSHOT = [("What is the capital of France?", ["Paris", "London", "Madrid", "Rome"], 0),
           ("What color is the sky on a clear day?", ["Green", "Blue", "Red", "Black"], 1),
           ("How many legs does a dog have?", ["Two", "Six", "Four", "Eight"], 2),
           ("Which animal says meow?", ["Cow", "Dog", "Duck", "Cat"], 3),
           ("What do bees make?", ["Honey", "Milk", "Silk", "Wool"], 0)]
QUESTIONS = [("What is the capital of Italy?", ["Berlin", "Rome", "Lisbon", "Paris"], 1),
             ("What is frozen water called?", ["Ice", "Steam", "Sand", "Smoke"], 0),
             ("Which planet do we live on?", ["Mars", "Venus", "Earth", "Jupiter"], 2),
             ("How many days are in a week?", ["Five", "Ten", "Three", "Seven"], 3),
             ("What is the opposite of hot?", ["Cold", "Warm", "Loud", "Tall"], 0),
             ("Which fruit is yellow and long?", ["Apple", "Banana", "Grape", "Cherry"], 1),
             ("What do cows drink?", ["Oil", "Juice", "Water", "Milk"], 2),
             ("What is the capital of Germany?", ["Vienna", "Munich", "Hamburg", "Berlin"], 3)]
TEXTS = ["The cat sat on the mat and looked out of the window at the birds in the garden.",
         "Paris is the capital of France. It is known for the Eiffel Tower and its museums."]
GEN = [("2 + 2 =", "4"), ("The capital of France is", "Paris"), ("The first letter of the alphabet is", "A")]

MC_YAML = """task: radixlm_mc
dataset_path: json
dataset_kwargs:
  data_files:
    train: {dir}/mc_train.jsonl
    test: {dir}/mc_test.jsonl
output_type: multiple_choice
training_split: train
fewshot_split: train
test_split: test
fewshot_config:
  sampler: first_n
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
num_fewshot: 5
metric_list:
  - metric: acc
"""
PPL_YAML = """task: radixlm_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/ppl_test.jsonl
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
"""
GEN_YAML = """task: radixlm_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/gen_test.jsonl
output_type: generate_until
test_split: test
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
"""


def write_tasks(root: Path) -> Path:
    """Task YAMLs and their jsonl data in root (lm-eval reads them offline: dataset_path json)."""
    def jsonl(name: str, rows: list[dict]) -> None:
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    mc = [{"question": q, "choices": c, "answer": a} for q, c, a in FEWSHOT]
    jsonl("mc_train.jsonl", mc)
    jsonl("mc_test.jsonl", [{"question": q, "choices": c, "answer": a} for q, c, a in QUESTIONS])
    jsonl("ppl_test.jsonl", [{"text": t} for t in TEXTS])
    jsonl("gen_test.jsonl", [{"prompt": p, "answer": a} for p, a in GEN])
    for name, text in (("mc", MC_YAML), ("ppl", PPL_YAML), ("gen", GEN_YAML)):
        (root / f"{name}.yaml").write_text(text.format(dir=root))
    return root


@pytest.fixture(scope="module")
def smol_server():
    srv = ServerProcess(None, "--served-model-name", "smollm2").wait_ready()
    yield srv
    srv.stop()
    srv.remove_tmpdir()


@pytest.fixture(scope="module")
def task_manager(tmp_path_factory):
    from lm_eval.tasks import TaskManager

    root = write_tasks(tmp_path_factory.mktemp("lm_eval_tasks"))
    return TaskManager(include_path=str(root), include_defaults=False)  # only ours: no index of lm-eval's own


def evaluate(lm, task_manager, names: list[str]) -> dict:
    """Per request: (loglikelihood, is_greedy) for multiple choice, the loglikelihood for rolling, the text for
    generation, in document order; and the aggregated results."""
    import lm_eval

    out = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=task_manager, log_samples=True)
    samples = {t: [s["filtered_resps"] for s in sorted(out["samples"][t], key=lambda s: s["doc_id"])] for t in names}
    return {"results": out["results"], "samples": samples}


def cache_stats(srv: ServerProcess) -> dict:
    return httpx.get(srv.url + "/server_info", headers=srv.headers(), timeout=30).json()["cache_stats"]


def test_local_completions_equals_hf_and_hits_the_cache(smol_server, task_manager, monkeypatch):
    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from radixlm.runtime.model.default_model import default_model_dir

    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # local-completions sends it as the bearer token
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # No tokenizer given: local-completions' default detection finds the server's routes and uses them.
    served = LocalCompletionsAPI(model="smollm2", base_url=smol_server.url + "/v1/completions", auth_token=KEY,
                                 max_length=2048)
    assert served.tokenizer_backend == "remote"
    before = cache_stats(smol_server)
    got = evaluate(served, task_manager, ["radixlm_mc"])
    after = cache_stats(smol_server)
    rest = evaluate(served, task_manager, ["radixlm_ppl", "radixlm_gen"])
    got["samples"].update(rest["samples"])
    hf = HFLM(pretrained=str(default_model_dir()), dtype="float32", device="cpu", batch_size=8)
    want = evaluate(hf, task_manager, ["radixlm_mc", "radixlm_ppl", "radixlm_gen"])

    # 5-shot multiple choice: the shared few-shot prefix and each question come from the radix cache.
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    assert (after["cached_tokens"] - before["cached_tokens"]) / prompt >= 0.9
    assert got["results"]["radixlm_mc"]["acc,none"] == want["results"]["radixlm_mc"]["acc,none"]
    for g_doc, w_doc in zip(got["samples"]["radixlm_mc"], want["samples"]["radixlm_mc"], strict=True):
        for (g_ll, g_greedy), (w_ll, w_greedy) in zip(g_doc, w_doc, strict=True):
            assert abs(g_ll - w_ll) <= 1e-4 and g_greedy == w_greedy
    # Rolling loglikelihoods sum ~20 tokens, each within ~2e-5 of transformers' fp32 (the engine's own
    # agreement, cache or not): a relative bound.
    for g_doc, w_doc in zip(got["samples"]["radixlm_ppl"], want["samples"]["radixlm_ppl"], strict=True):
        assert abs(g_doc[0] - w_doc[0]) <= 1e-5 * abs(w_doc[0])
    assert got["samples"]["radixlm_gen"] == want["samples"]["radixlm_gen"]
