"""Interpreter semantics against the scripted backend: variables, params, roles, fork/join, errors."""

from __future__ import annotations

import json
import sys
import time

import pytest

import radixlm as sgl
from radixlm.lang.params import REGEX_INT
from radixlm.sampling_params import SamplingParamError


def test_variables_text_and_param_merging(scripted):
    backend = scripted()

    @sgl.function
    def prog(s, question):
        s += "Q: " + question + "\nA:"
        s += sgl.gen("answer", max_tokens=7, stop="\n")
        s += "\nWhy?" + sgl.gen("why", temperature=0.1)

    state = prog.run(question="2+2", temperature=0.7, backend=backend)
    p1 = "Q: 2+2\nA:"
    a1 = f"<{len(p1)}>"
    p2 = p1 + a1 + "\nWhy?"
    assert state["answer"] == a1
    assert state["why"] == f"<{len(p2)}>"
    assert state.text() == p2 + state["why"]
    assert "answer" in state and "nope" not in state
    (_, prompt1, params1), (_, prompt2, params2) = backend.calls
    assert (prompt1, prompt2) == (p1, p2)
    # gen overrides win, run() defaults fill the rest, the template's stop string is always added
    assert (params1.max_new_tokens, params1.temperature) == (7, 0.7)
    assert params1.stop == ["\n", "<|im_end|>"]
    assert (params2.max_new_tokens, params2.temperature) == (128, 0.1)
    assert state.get_meta_info("answer") == {"prompt": p1}


def test_dtype_int_becomes_regex_with_whitespace_stops(scripted):
    backend = scripted(reply=lambda p, params: "42")

    @sgl.function
    def prog(s):
        s += "n = " + sgl.gen_int("n") + " m = " + sgl.gen("m", dtype=int, regex="x+")

    prog.run(backend=backend)
    for _, _, params in backend.calls:
        assert params.regex == REGEX_INT
        assert params.stop[-2:] == [" ", "\n"]


def test_json_schema_dict_is_sent_as_json_string(scripted):
    backend = scripted(reply=lambda p, params: "{}")
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}

    @sgl.function
    def prog(s):
        s += sgl.gen("j", json_schema=schema)

    prog.run(backend=backend)
    assert json.loads(backend.calls[0][2].json_schema) == schema


def test_gen_with_choices_is_select_and_n_samples_give_a_list(scripted):
    backend = scripted(logprobs={"yes": [-0.1], "no": [-2.0]})

    @sgl.function
    def prog(s):
        s += "Ok? " + sgl.gen("ans", choices=["no", "yes"]) + "\n" + sgl.gen("many", n=3)

    state = prog.run(backend=backend)
    assert state["ans"] == "yes"
    assert state["many"] == [f"<{len('Ok? yes' + chr(10))}>#{i}" for i in range(3)]
    assert state.text().endswith("\n" + state["many"][0])
    assert backend.kinds() == ["select", "generate"]


def test_invalid_sampling_param_fails_with_program_line(scripted):
    @sgl.function
    def prog(s):
        s += "x"
        line = sys._getframe().f_lineno + 1
        s += sgl.gen("a", temperature=5.0)
        s["line"] = line

    with pytest.raises(SamplingParamError) as info:
        prog.run(backend=scripted())
    assert info.value.param == "temperature"
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert __file__ in notes
    assert 'sgl.gen("a", temperature=5.0)' in notes


def test_backend_exception_surfaces_with_program_line(scripted):
    class Boom(RuntimeError):
        pass

    def reply(prompt, params):
        if "fail" in prompt:
            raise Boom("backend down")
        return "ok"

    lines = {}

    @sgl.function
    def prog(s):
        s += "first" + sgl.gen("a")
        s += " fail"
        lines["gen"] = sys._getframe().f_lineno + 1
        s += sgl.gen("b")
        s += " never"

    with pytest.raises(Boom) as info:
        prog.run(backend=scripted(reply=reply))
    origin = info.value.radixlm_origin
    assert (origin.filename, origin.lineno) == (__file__, lines["gen"])
    assert f"line {lines['gen']}" in "\n".join(info.value.__notes__)


def test_error_in_a_later_read_raises_same_exception(scripted):
    def reply(prompt, params):
        raise ValueError("nope")

    @sgl.function
    def prog(s):
        s += sgl.gen("a")
        return s["a"]

    with pytest.raises(ValueError, match="nope"):
        prog.run(backend=scripted(reply=reply))


def test_var_scope_and_bind_and_positional_args(scripted):
    backend = scripted(reply=lambda p, params: "R")

    @sgl.function
    def prog(s, a, b="B"):
        with s.var_scope("scoped"):
            s += a + sgl.gen("g") + b
        s += "!"

    state = prog.bind(b="bee").run(a="x", backend=backend)
    assert state["scoped"] == "xRbee"
    assert state.text() == "xRbee!"
    assert prog("y", backend=backend).text() == "yRB!"


def test_fork_gather_variable_commits_prefix_once(scripted):
    backend = scripted()

    @sgl.function
    def prog(s):
        s += "Plan:"
        forks = s.fork(3)
        forks += lambda i: f" step {i}:" + sgl.gen("step")
        forks.join()
        s += " done"

    state = prog.run(backend=backend)
    expected = [f"<{len(f'Plan: step {i}:')}>" for i in range(3)]
    assert state["step"] == expected  # gathered in branch order, not completion order
    assert state.text() == "Plan: done"
    assert backend.calls[0] == ("commit", "Plan:", None)
    assert backend.kinds().count("commit") == 1


def test_fork_concate_and_append_text_and_kv_modes(scripted):
    for concat_kv in (False, True):
        backend = scripted(concat_kv=concat_kv, reply=lambda p, params: p[-1])

        @sgl.function
        def prog(s):
            s += "P"
            forks = s.fork(2)
            for i, f in enumerate(forks):
                f += str(i) + sgl.gen("x")
            forks.join("concate_and_append")
            s += "|" + sgl.gen("after")

        state = prog.run(backend=backend)
        assert state.text() == "P0011|" + "|"
        concat = [c for c in backend.calls if c[0] == "concatenate_and_append"]
        if concat_kv:
            assert len(concat) == 1
            src_rids, dst_rid = concat[0][1], concat[0][2]
            assert dst_rid == state.stream_executor.sid and len(src_rids) == 2
            assert backend.kinds().count("commit") == 3  # prefix + one per branch
        else:
            assert concat == []


def test_copy_context_manager_gathers(scripted):
    backend = scripted(reply=lambda p, params: "v")

    @sgl.function
    def prog(s):
        s += "a"
        with s.copy() as c:
            c += sgl.gen("inner")

    state = prog.run(backend=backend)
    assert state["inner"] == ["v"] and state.text() == "a"


def test_unknown_join_mode_rejected(scripted):
    @sgl.function
    def prog(s):
        s.fork(1).join("sideways")

    with pytest.raises(ValueError, match="join mode"):
        prog.run(backend=scripted())


def test_appending_a_non_expression_is_rejected(scripted):
    @sgl.function
    def prog(s):
        s += 3

    with pytest.raises(TypeError):
        prog.run(backend=scripted())


def test_reused_variable_name_is_ready_only_after_the_last_write(scripted):
    def reply(prompt, params):
        time.sleep(0.05 if prompt.endswith("1:") else 0.0)
        return prompt[-2]

    @sgl.function
    def prog(s):
        s += "1:" + sgl.gen("v")
        s += " 2:" + sgl.gen("v")
        return s["v"]  # read while the first gen may still be running

    state = prog.run(backend=scripted(reply=reply))
    assert state.ret_value == "2" == state["v"]


def test_unnamed_gen_appends_text(scripted):
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen(max_tokens=2)

    assert prog.run(backend=scripted(reply=lambda p, params: "y")).text() == "xy"
    assert list(prog.run(stream=True, backend=scripted(reply=lambda p, params: "y")).text_iter()) != []
