"""select's choices methods, run_batch (order, progress bar, prefix warm-up) and tracing."""

from __future__ import annotations

import time

import pytest

import radixlm as sgl
from radixlm.lang.global_config import global_config

# Three choices built so the three methods disagree (worked out from the definitions):
#   mean logprob:            A (-1.0)  > C (-1.15) > B (-1.75)            -> token_length_normalized picks A
#   first token:             B (-0.5)  > C (-0.8)  > A (-1.0)             -> greedy_token_selection picks B
#   mean(cond - uncond), first uncond counted as 0:
#                            A mean(-1, -0.9) = -0.95; B mean(-0.5, 0.5) = 0; C mean(-0.8, 2.5) = 0.85 -> C
LOGPROBS = {"A": [-1.0, -1.0], "B": [-0.5, -3.0], "C": [-0.8, -1.5]}
UNCONDITIONAL = {"A": [None, -0.1], "B": [None, -3.5], "C": [None, -4.0]}


def _mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.parametrize("method, expected", [
    (sgl.token_length_normalized, max(LOGPROBS, key=lambda c: _mean(LOGPROBS[c]))),
    (sgl.greedy_token_selection, max(LOGPROBS, key=lambda c: LOGPROBS[c][0])),
    (sgl.unconditional_likelihood_normalized,
     max(LOGPROBS, key=lambda c: _mean([a - (b or 0.0) for a, b in zip(LOGPROBS[c], UNCONDITIONAL[c])]))),
])
def test_select_methods(scripted, method, expected):
    backend = scripted(logprobs=LOGPROBS, unconditional=UNCONDITIONAL)

    @sgl.function
    def prog(s):
        s += "Pick: " + sgl.select("pick", choices=["A", "B", "C"], choices_method=method) + "."

    state = prog.run(backend=backend)
    assert state["pick"] == expected
    assert state.text() == f"Pick: {expected}."
    meta = state.get_meta_info("pick")
    assert meta["normalized_prompt_logprobs"] == [_mean(LOGPROBS[c]) for c in "ABC"]


def test_select_methods_disagree_so_the_test_can_tell_them_apart():
    picks = {max(LOGPROBS, key=lambda c: _mean(LOGPROBS[c])), max(LOGPROBS, key=lambda c: LOGPROBS[c][0])}
    assert len(picks) == 2


def test_greedy_pads_shorter_choice_with_its_mean(scripted):
    # "ab" ties "abc" on both tokens; past its end "ab" competes with its mean (-0.5) vs "abc"'s -2.0.
    backend = scripted(logprobs={"ab": [-0.5, -0.5], "abc": [-0.5, -0.5, -2.0]})

    @sgl.function
    def prog(s):
        s += sgl.select("x", choices=["abc", "ab"], choices_method=sgl.greedy_token_selection)

    assert prog.run(backend=backend)["x"] == "ab"


def test_run_batch_keeps_input_order_and_shows_progress(scripted, capsys):
    def slow_reply(prompt, params):
        time.sleep(0.002 * (10 - int(prompt[-1])))  # later items finish first
        return prompt[-1]

    backend = scripted(reply=slow_reply)

    @sgl.function
    def prog(s, i):
        s += f"item {i}" + sgl.gen("echo")

    states = prog.run_batch([{"i": i} for i in range(8)], backend=backend, progress_bar=True, num_threads=8)
    assert [st["echo"] for st in states] == [str(i) for i in range(8)]
    err = capsys.readouterr().err
    assert "8/8" in err  # a real tqdm bar ran to completion
    # tuples map to parameters in order
    assert [st["echo"] for st in prog.run_batch([(3,), (4,)], backend=backend, num_threads=1)] == ["3", "4"]


FEW_SHOT = "You answer arithmetic questions with a single number.\nQ: 1+1\nA: 2\nQ: 2+3\nA: 5\n"


def test_run_batch_warms_the_constant_prefix_once(scripted):
    backend = scripted(reply=lambda p, params: "7")

    @sgl.function
    def prog(s, q):
        s += sgl.system("Be exact.")
        s += FEW_SHOT
        s += f"Q: {q}\nA:" + sgl.gen("a")

    prog.run_batch([{"q": "3+4"}, {"q": "5+2"}, {"q": "6+1"}], backend=backend)
    warmups = [c for c in backend.calls if c[0] == "cache_prefix"]
    assert len(warmups) == 1
    assert backend.calls[0][0] == "cache_prefix"  # before any generation
    prefix = warmups[0][1]
    assert prefix == "<|im_start|>system\nBe exact.<|im_end|>\n" + FEW_SHOT
    # every generation prompt starts with the warmed prefix, so each one hits the cache
    assert all(p.startswith(prefix) for kind, p, _ in backend.calls if kind == "generate")


def test_no_warmup_for_single_item_or_short_prefix(scripted):
    backend = scripted()

    @sgl.function
    def short(s, q):
        s += "Q: " + q + sgl.gen("a")

    @sgl.function
    def long(s, q):
        s += FEW_SHOT + "Q: " + q + sgl.gen("a")

    short.run_batch([{"q": "a"}, {"q": "b"}], backend=backend)
    long.run_batch([{"q": "a"}], backend=backend)
    assert "cache_prefix" not in backend.kinds()
    long.run_batch([{"q": "a"}, {"q": "b"}], backend=backend)
    assert backend.kinds().count("cache_prefix") == 1


def test_run_batch_surfaces_program_errors(scripted):
    def reply(prompt, params):
        if prompt.endswith("bad"):
            raise KeyError("bad item")
        return "ok"

    @sgl.function
    def prog(s, x):
        s += x + sgl.gen("a")

    with pytest.raises(KeyError):
        prog.run_batch([{"x": "good"}, {"x": "bad"}], backend=scripted(reply=reply))


def test_trace_stops_at_first_dynamic_part(scripted):
    backend = scripted()

    @sgl.function
    def prog(s, name):
        s += sgl.user("Hello " + name)
        s += sgl.assistant(sgl.gen("a"))

    result = prog.trace(backend=backend)
    assert result.prefix == "<|im_start|>user\nHello "
    assert backend.calls == []  # tracing never calls the model

    @sgl.function
    def fstring(s, name):
        s += "Constant. "
        s += f"Name: {name}"

    assert fstring.trace(backend=backend).prefix == "Constant. "


def test_default_backend_and_helpers(scripted):
    backend = scripted(reply=lambda p, params: "d")
    sgl.set_default_backend(backend)
    assert global_config.default_backend is backend

    @sgl.function
    def prog(s):
        s += sgl.gen("a")

    assert prog.run()["a"] == "d"
    assert sgl.flush_cache() is None and sgl.get_server_info() is None
    sgl.set_default_backend(None)
    with pytest.raises(ValueError, match="no backend"):
        prog.run()
    assert sgl.flush_cache() is False
