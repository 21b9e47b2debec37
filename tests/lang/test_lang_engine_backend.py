"""Engine backend: transport mapping and locking on a fake engine, then programs on the real in-process
Engine with a tiny random model, select checked against a transformers reference."""

from __future__ import annotations

import time

import pytest
from fake_native_server import REPLY, _one

import radixlm as sgl
from radixlm.lang.backend.engine import EngineBackend, backend_for_engine
from radixlm.testing import build_tokenizer


class FakeEngine:
    """Duck-typed engine: character tokens like the fake server; flags overlapping generate calls."""

    def __init__(self, tokenizer, concurrent: bool = False):
        self.tokenizer = tokenizer
        self.calls: list[dict] = []
        self.active = 0
        self.overlapped = False
        if concurrent:
            self.supports_concurrent_generate = True

    def generate(self, prompt=None, sampling_params=None, input_ids=None, stream=False, **kw):
        self.calls.append({"prompt": prompt, "sampling_params": sampling_params, "input_ids": input_ids,
                           "stream": stream, **kw})
        self.active += 1
        self.overlapped |= self.active > 1
        time.sleep(0.01)
        self.active -= 1
        body = {**kw, "text": prompt} if input_ids is None else {**kw, "input_ids": input_ids}
        prompts = prompt if isinstance(prompt, list) else [prompt]
        if input_ids is not None:
            prompts = ["".join(map(chr, ids)) for ids in input_ids]
        results = [_one(p, sampling_params or {}, body) for p in prompts]
        if stream:
            return iter([{**results[0], "text": results[0]["text"][:i]} for i in range(1, len(results[0]["text"]) + 1)])
        return results if isinstance(prompt, list) or input_ids is not None else results[0]

    def flush_cache(self):
        return True

    def get_server_info(self):
        return {"model_path": "/models/SmolLM2-135M-Instruct"}

    def shutdown(self):
        pass


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def test_engine_instance_is_a_backend(tokenizer, scripted):
    engine = FakeEngine(tokenizer)

    @sgl.function
    def prog(s):
        s += sgl.user("Capital?") + sgl.assistant(sgl.gen("a", max_tokens=5))

    state = prog.run(backend=engine)
    assert state["a"] == REPLY[:5]
    assert backend_for_engine(engine) is backend_for_engine(engine)  # one backend (one lock) per engine
    # the template came from the engine's tokenizer (ChatML), so the stop string is ChatML's
    call = engine.calls[0]
    assert call["prompt"] == "<|im_start|>user\nCapital?<|im_end|>\n<|im_start|>assistant\n"
    assert call["sampling_params"]["stop"] == ["<|im_end|>"]
    assert sgl.flush_cache(engine) is True
    assert sgl.get_server_info(engine)["model_path"].endswith("Instruct")


def test_select_maps_to_prompt_and_input_ids(tokenizer):
    engine = FakeEngine(tokenizer)

    @sgl.function
    def prog(s):
        s += "Pick: " + sgl.select("x", choices=["ab", "cd"], choices_method=sgl.unconditional_likelihood_normalized)

    prog.run(backend=engine)
    first, second, third = engine.calls
    assert first["prompt"] == "Pick: " and first["sampling_params"] == {"max_new_tokens": 0}
    assert second["prompt"] == ["Pick: ab", "Pick: cd"] and second["logprob_start_len"] == len("Pick: ") - 2
    assert third["prompt"] is None and third["input_ids"] == [[ord("a"), ord("b")], [ord("c"), ord("d")]]


@pytest.mark.parametrize("concurrent", [False, True])
def test_calls_are_serialized_unless_engine_is_concurrent(tokenizer, concurrent):
    engine = FakeEngine(tokenizer, concurrent=concurrent)
    backend = EngineBackend(engine)

    @sgl.function
    def prog(s, i):
        s += f"q{i}" + sgl.gen("a", max_tokens=2)

    states = prog.run_batch([{"i": i} for i in range(6)], backend=backend, num_threads=6)
    assert [st["a"] for st in states] == [REPLY[:2]] * 6
    assert engine.overlapped is concurrent


def test_stream_through_engine(tokenizer):
    engine = FakeEngine(tokenizer)

    @sgl.function
    def prog(s):
        s += "Go" + sgl.gen("a", max_tokens=6)

    state = prog.run(stream=True, backend=EngineBackend(engine))
    assert "".join(state.text_iter("a")) == REPLY[:6]
    assert engine.calls[0]["stream"] is True


# ---- the real in-process engine -----------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    runtime_engine = pytest.importorskip("radixlm.runtime.engine")
    eng = runtime_engine.Engine(model_path=str(tiny_llama_dir))
    yield eng
    eng.shutdown()


def _reference_mean_logprobs(model_dir, prefix: str, choices: list[str]) -> tuple[list[float], list[list[int]]]:
    """Mean logprob of each choice's tokens after the prefix, straight from transformers (and those tokens)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    n_prefix = len(tok(prefix).input_ids)
    means, choice_ids = [], []
    for choice in choices:
        ids = tok(prefix + choice).input_ids
        assert ids[:n_prefix] == tok(prefix).input_ids  # clean boundary: the choice's tokens are its own
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        values = [logprobs[i - 1, ids[i]].item() for i in range(n_prefix, len(ids))]
        means.append(sum(values) / len(values))
        choice_ids.append(ids[n_prefix:])
    return means, choice_ids


def test_select_on_engine_matches_transformers_reference(engine, tiny_llama_dir):
    prefix, choices = "The capital of France is", [" Paris", " Berlin", " Rome"]

    @sgl.function
    def prog(s):
        s += prefix + sgl.select("city", choices=choices)

    state = prog.run(backend=engine)
    reference, choice_ids = _reference_mean_logprobs(tiny_llama_dir, prefix, choices)
    assert state["city"] == choices[max(range(3), key=reference.__getitem__)]
    meta = state.get_meta_info("city")
    assert meta["normalized_prompt_logprobs"] == pytest.approx(reference, abs=1e-3)
    assert [[e[1] for e in entries] for entries in meta["input_token_logprobs"]] == choice_ids


def test_program_on_engine_forks_hit_the_cache(engine):
    @sgl.function
    def prog(s):
        s += sgl.system("You are a terse assistant. " * 4)
        s += sgl.user("Name two colors.")
        forks = s.fork(2)
        forks += lambda i: sgl.assistant(sgl.gen("color", max_tokens=3, temperature=0))
        forks.join()
        return [f.get_meta_info("color") for f in forks]

    state = prog.run(backend=engine)
    assert len(state["color"]) == 2
    assert [m["role"] for m in state.messages()] == ["system", "user"]
    # the fork committed the shared prefix, so both branches were served from the radix cache
    assert all(meta["cached_tokens"] > 0 for meta in state.ret_value)


def test_run_batch_on_engine_hits_the_cache(engine):
    few_shot = "Q: What color is the sky?\nA: blue\nQ: What is two plus two?\nA: four\n"

    @sgl.function
    def qa(s, q):
        s += few_shot + "Q: " + q + "\nA:" + sgl.gen("a", max_tokens=3, temperature=0, stop="\n")

    states = qa.run_batch([{"q": "Capital of France?"}, {"q": "Capital of Italy?"}, {"q": "Capital of Germany?"}],
                          backend=engine, progress_bar=False)
    assert [st.text().startswith(few_shot + "Q: Capital of") for st in states] == [True] * 3
    assert all(st.get_meta_info("a")["cached_tokens"] > 0 for st in states)
