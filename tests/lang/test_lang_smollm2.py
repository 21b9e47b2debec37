"""The frontend program suite on the real default model (SmolLM2-135M-Instruct), once per backend: the
in-process Engine and, when a radixlm server starts, RuntimeEndpoint over HTTP. Outputs are checked
against references (the unconstrained generation, the model's own chat template, transformers' logprobs,
jsonschema) and the radix cache is checked to serve forked branches and batch items."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

import radixlm as sgl
from radixlm.lang.backend.engine import backend_for_engine
from radixlm.lang.params import REGEX_FLOAT, REGEX_INT, REGEX_STR

pytestmark = pytest.mark.slow

FEW_SHOT = ("Q: What is the capital of Italy?\nA: Rome\n\n"
            "Q: What is the capital of Japan?\nA: Tokyo\n\n"
            "Q: What is the capital of Egypt?\nA: Cairo\n\n")
CAPITALS = [("France", "Paris"), ("Germany", "Berlin"), ("Spain", "Madrid"), ("England", "London"),
            ("Russia", "Moscow"), ("China", "Beijing"), ("Greece", "Athens"), ("Portugal", "Lisbon")]
CHARACTER_REGEX = (r'\{"name": "[A-Z][a-z]{1,12}", '
                   r'"house": "(Gryffindor|Slytherin|Ravenclaw|Hufflepuff)", "age": [0-9]{1,2}\}')
CHARACTER_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "city": {"type": "string", "maxLength": 20}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["engine", "http"])
def backend(request):
    if request.param == "engine":
        return backend_for_engine(request.getfixturevalue("smol_engine"))
    return request.getfixturevalue("smol_runtime").endpoint


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    from radixlm.runtime.model.loader import resolve_model_path

    return transformers.AutoTokenizer.from_pretrained(resolve_model_path(None))


def _greedy_text(backend, prompt: str, max_new_tokens: int) -> str:
    """The reference: a plain native request, no stop strings, no program around it."""
    params = {"max_new_tokens": max_new_tokens, "temperature": 0}
    return backend.transport.generate({"text": prompt, "sampling_params": params})["text"]


@sgl.function
def few_shot_qa(s, country):
    s += FEW_SHOT + f"Q: What is the capital of {country}?\nA:" + sgl.gen("answer", max_tokens=12, stop="\n")


def test_few_shot_qa_stops_at_the_stop_string(backend):
    state = few_shot_qa.run(country="France", temperature=0, backend=backend)
    full = _greedy_text(backend, FEW_SHOT + "Q: What is the capital of France?\nA:", 12)
    assert "\n" in full  # precondition: without the stop string the model runs on to the next line
    assert state["answer"] == full.split("\n")[0]
    assert state["answer"].strip() == "Paris"
    assert state.get_meta_info("answer")["finish_reason"] == {"type": "stop", "matched": "\n"}


@sgl.function
def multi_turn_chat(s, question_1, question_2):
    s += sgl.system("You are a helpful assistant. Answer briefly.")
    s += sgl.user(question_1)
    s += sgl.assistant(sgl.gen("answer_1", max_tokens=24))
    s += sgl.user(question_2)
    s += sgl.assistant(sgl.gen("answer_2", max_tokens=24))


def test_multi_turn_chat_messages_follow_the_model_template(backend, tokenizer):
    q1, q2 = "What is the capital of France?", "And of Germany?"
    state = multi_turn_chat.run(question_1=q1, question_2=q2, temperature=0, backend=backend)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert [messages[1]["content"], messages[3]["content"]] == [q1, q2]
    assert messages[2]["content"] == state["answer_1"].strip() and messages[4]["content"] == state["answer_2"].strip()
    assert "Paris" in state["answer_1"]
    # The state's text is exactly what the model's own chat template renders for these messages.
    assert state.text() == tokenizer.apply_chat_template(messages, tokenize=False)
    # The second turn reuses the first turn's KV (its prompt and its answer).
    first, second = state.get_meta_info("answer_1"), state.get_meta_info("answer_2")
    assert second["cached_tokens"] >= first["prompt_tokens"] + first["completion_tokens"] - 2


@sgl.function
def pick_city(s):
    s += sgl.user("What is the capital of France? Answer with the city name only.")
    s += sgl.assistant(sgl.select("city", choices=["London", "Paris", "Berlin", "Rome"]))


@pytest.fixture(scope="module")
def hf_model():
    import transformers

    from radixlm.runtime.model.loader import resolve_model_path

    return transformers.AutoModelForCausalLM.from_pretrained(resolve_model_path(None), dtype=torch.float32)


def test_select_matches_transformers_scores(backend, tokenizer, hf_model):
    state = pick_city.run(backend=backend)
    # The reference prompt: the model's template rendering the conversation up to the answer.
    prefix = tokenizer.apply_chat_template(state.messages()[:-1], tokenize=False, add_generation_prompt=True)
    assert state.text().startswith(prefix + state["city"])
    scores = state.get_meta_info("city")["normalized_prompt_logprobs"]
    reference = []
    for choice in ["London", "Paris", "Berlin", "Rome"]:
        ids = tokenizer(prefix + choice).input_ids
        num_prefix = len(tokenizer(prefix).input_ids)
        assert ids[:num_prefix] == tokenizer(prefix).input_ids  # a clean token boundary before the choice
        with torch.no_grad():
            logprobs = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), -1)
        reference.append(sum(logprobs[i - 1, ids[i]].item() for i in range(num_prefix, len(ids))) /
                         (len(ids) - num_prefix))
    assert scores == pytest.approx(reference, abs=2e-3)
    assert state["city"] == "Paris" == ["London", "Paris", "Berlin", "Rome"][reference.index(max(reference))]


@sgl.function
def typed_answers(s):
    s += sgl.user("How many legs does a spider have? Answer with a number.")
    s += sgl.assistant(sgl.gen_int("legs", max_tokens=6))
    s += sgl.user("What is half of 5? Answer with a decimal number.")
    s += sgl.assistant(sgl.gen("half", dtype=float, max_tokens=8))
    s += sgl.user("Is the sun hot? Answer True or False.")
    s += sgl.assistant(sgl.gen("hot", dtype=bool))
    s += sgl.user("Name a color, in double quotes.")
    s += sgl.assistant(sgl.gen_string("color", max_tokens=16))


def test_gen_int_and_dtype_produce_their_types(backend):
    state = typed_answers.run(temperature=0, backend=backend)
    assert re.fullmatch(REGEX_INT, state["legs"]) and int(state["legs"]) >= 0
    assert re.fullmatch(REGEX_FLOAT, state["half"]) and float(state["half"]) >= 0
    assert state["hot"] in ("True", "False")
    assert re.fullmatch(REGEX_STR, state["color"]), state["color"]


@sgl.function
def character_json(s, name):
    s += sgl.user(f"Describe the Harry Potter character {name} as JSON.")
    s += sgl.assistant(sgl.gen("by_regex", max_tokens=64, regex=CHARACTER_REGEX))
    s += sgl.user(f"Now describe {name} as JSON with name, age and city.")
    s += sgl.assistant(sgl.gen("by_schema", max_tokens=96, json_schema=CHARACTER_SCHEMA))


def test_json_via_regex_and_json_schema_validates(backend):
    state = character_json.run(name="Hermione Granger", temperature=0, backend=backend)
    assert re.fullmatch(CHARACTER_REGEX, state["by_regex"]), state["by_regex"]
    assert json.loads(state["by_regex"])["house"] in ("Gryffindor", "Slytherin", "Ravenclaw", "Hufflepuff")
    assert state.get_meta_info("by_schema")["finish_reason"]["type"] == "stop", state["by_schema"]
    jsonschema.validate(json.loads(state["by_schema"]), CHARACTER_SCHEMA)


@sgl.function
def expert_answer(s, question):
    s += sgl.user(f"Question: {question}\nWhich field of expertise is this question about? "
                  "Answer with the field only.")
    s += sgl.assistant(sgl.gen("field", max_tokens=8, stop=[".", "\n"]))
    s += sgl.user(f"As an expert in {s['field'].strip()}, answer the question in one sentence.")
    s += sgl.assistant(sgl.gen("answer", max_tokens=32))


def test_expert_answer_reuses_a_variable(backend):
    state = expert_answer.run(question="Why do leaves change color in autumn?", temperature=0, backend=backend)
    field = state["field"].strip()
    assert field and f"As an expert in {field}, answer" in state.text()
    assert state["answer"].strip()
    first = state.get_meta_info("field")
    assert state.get_meta_info("answer")["cached_tokens"] >= first["prompt_tokens"]


@sgl.function
def skeleton_of_thought(s, topic):
    s += sgl.system("You are a helpful assistant. Be brief.")
    s += sgl.user(f"Give five tips for {topic}. One short line each.")
    s += sgl.assistant(sgl.gen("skeleton", max_tokens=40))
    forks = s.fork(5)
    for i, branch in enumerate(forks):
        branch += sgl.user(f"Expand tip {i + 1} in one sentence.")
        branch += sgl.assistant(sgl.gen("detail", max_tokens=16))
    forks.join()
    s += sgl.user("Summarize all five tips in one sentence.")
    s += sgl.assistant(sgl.gen("summary", max_tokens=16))
    return forks


def test_skeleton_of_thought_branches_share_the_prefix(backend, tokenizer):
    state = skeleton_of_thought.run(topic="staying healthy", temperature=0, backend=backend)
    forks = state.ret_value
    details = state["detail"]
    assert isinstance(details, list) and len(details) == 5 and all(d.strip() for d in details)
    assert details == [branch["detail"] for branch in forks]  # gathered in branch order
    assert "Expand tip" not in state.text()  # gather_variable leaves the parent's text alone
    fork_point = tokenizer(forks[0].text().split("<|im_start|>user\nExpand tip 1")[0]).input_ids
    for i, branch in enumerate(forks):
        assert f"Expand tip {i + 1} in one sentence." in branch.text()
        # Every branch found the whole forked prefix in the radix cache (it was prefilled once).
        assert branch.get_meta_info("detail")["cached_tokens"] >= len(fork_point) - 1
    assert state["summary"].strip()


def test_streaming_text_iter_matches_the_finished_run(backend):
    streamed = multi_turn_chat.run(question_1="Name three fruits.", question_2="And three vegetables?",
                                   temperature=0, stream=True, backend=backend)
    pieces = list(streamed.text_iter("answer_1"))
    assert len(pieces) > 1 and all(pieces)  # it arrived in pieces, none of them empty
    assert "".join(pieces) == streamed["answer_1"]
    whole = list(streamed.text_iter())
    assert "".join(whole) == streamed.text()
    done = multi_turn_chat.run(question_1="Name three fruits.", question_2="And three vegetables?",
                               temperature=0, backend=backend)
    assert [streamed["answer_1"], streamed["answer_2"]] == [done["answer_1"], done["answer_2"]]


@sgl.function
def one_word(s, min_tokens):
    s += sgl.user("What is the capital of France? Answer in one word.")
    s += sgl.assistant(sgl.gen("answer", max_tokens=32, min_tokens=min_tokens))


def test_min_tokens_keeps_generating_past_eos(backend):
    free = one_word.run(min_tokens=0, temperature=0, backend=backend).get_meta_info("answer")
    assert free["finish_reason"]["type"] == "stop" and free["completion_tokens"] < 12  # precondition
    forced = one_word.run(min_tokens=free["completion_tokens"] + 6, temperature=0, backend=backend)
    assert forced.get_meta_info("answer")["completion_tokens"] >= free["completion_tokens"] + 6


def test_run_batch_progress_bar_and_cache_hits(backend, capsys):
    states = few_shot_qa.run_batch([{"country": c} for c, _ in CAPITALS], temperature=0, progress_bar=True,
                                   backend=backend)
    assert f"{len(CAPITALS)}/{len(CAPITALS)}" in capsys.readouterr().err  # tqdm drew the bar to the end
    for state, (country, _) in zip(states, CAPITALS):
        assert f"capital of {country}?" in state.text()  # results come back in input order
        assert "\n" not in state["answer"]
        # The traced few-shot prefix was prefilled once, so every item hits the radix cache.
        assert state.get_meta_info("answer")["cached_tokens"] > 0
    correct = sum(state["answer"].strip() == capital for state, (_, capital) in zip(states, CAPITALS))
    assert correct >= len(CAPITALS) // 2, [s["answer"] for s in states]
