"""Program traces: a run records each gen/select/fork with its prompt span, cached tokens,
times and tokens out; save_trace writes one self-contained HTML file; run_batch(trace=...) records every
item into one trace; the trace exports as OpenTelemetry spans (in-memory exporter)."""

from __future__ import annotations

import json
import re

import pytest

import radixlm as sgl
from radixlm.trace.schema import decode_trace, encode_trace

FEW_SHOT = ("Answer with one word.\nQ: Capital of France? A: Paris\nQ: Capital of Italy? A: Rome\n"
            "Q: Capital of Spain? A: Madrid\n")


@sgl.function
def qa(s, question):
    s += FEW_SHOT + "Q: " + question + " A:"
    s += sgl.gen("answer", max_tokens=4, temperature=0)
    s += " Sure?" + sgl.select("sure", choices=["yes", "no"])


@sgl.function
def branches(s):
    s += FEW_SHOT
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Q: number {i}? A:" + sgl.gen("a", max_tokens=3, temperature=0)
    forks.join()


def _full_text(trace, state_id: str) -> str:
    states = {st.id: st for st in trace.states}
    st = states[state_id]
    return (_full_text(trace, st.parent)[:st.fork_pos] if st.parent else "") + st.text


def test_a_run_records_its_calls_with_prompt_spans(scripted):
    state = qa.run(question="Capital of Japan?", backend=scripted())
    trace = state.trace()
    assert trace.name == "qa" and len(trace.states) == 1 and trace.duration > 0
    kinds = [(c.kind, c.name) for c in trace.calls]
    assert kinds == [("gen", "answer"), ("select", "sure")]
    gen = trace.calls[0]
    text = _full_text(trace, gen.state)
    assert text[:gen.prompt_end].endswith("Q: Capital of Japan? A:")  # the prompt span
    assert text[gen.prompt_end:gen.output_end] == state["answer"]  # what the gen added
    assert 0 <= gen.start <= gen.end <= trace.calls[1].start <= trace.calls[1].end <= trace.duration
    assert decode_trace(encode_trace(trace)) == trace  # the wire form round-trips


def test_forks_are_states_under_their_parent(scripted):
    state = branches.run(backend=scripted())
    trace = state.trace()
    root = [st for st in trace.states if st.parent is None]
    kids = [st for st in trace.states if st.parent is not None]
    assert len(root) == 1 and len(kids) == 2
    fork = next(c for c in trace.calls if c.kind == "fork")
    assert sorted(fork.children) == sorted(k.id for k in kids)
    assert all(k.fork_pos == len(FEW_SHOT) and k.parent == root[0].id for k in kids)
    gens = [c for c in trace.calls if c.kind == "gen"]
    assert {c.state for c in gens} == {k.id for k in kids}
    for c in gens:  # a branch's prompt is the shared prefix plus its own text
        assert _full_text(trace, c.state)[:c.prompt_end].startswith(FEW_SHOT)
    assert [c.kind for c in trace.calls].count("commit") == 1  # the shared prefix is prefilled once


def test_save_trace_writes_a_self_contained_page(scripted, tmp_path):
    state = qa.run(question="What is </script><b>?", backend=scripted())
    page = state.save_trace(tmp_path / "run.html").read_text()
    assert "RadixTrace.render" in page and "<link" not in page
    assert not re.search(r"""(?:src|href)=["']""", page)  # nothing loaded from anywhere: works offline
    data = re.search(r'<script id="trace-data" type="application/json">(.*?)</script>', page, re.S).group(1)
    assert "</script>" not in data  # the question's markup cannot break out of the JSON
    assert json.loads(data)["calls"][0]["name"] == "answer"
    assert json.loads(state.save_trace(tmp_path / "run.json").read_text())["name"] == "qa"


def test_run_batch_records_every_item_into_one_trace(scripted, tmp_path):
    out = tmp_path / "batch.html"
    states = qa.run_batch([{"question": f"Capital of {c}?"} for c in ("Peru", "Chile", "Cuba")], backend=scripted(),
                          trace=str(out), num_threads=2)
    trace = states[0].trace()
    assert trace.id == states[2].trace().id
    assert sorted(st.item for st in trace.states) == [0, 1, 2]
    assert sum(c.kind == "gen" for c in trace.calls) == 3
    assert out.exists() and trace.id in out.read_text()


def test_trace_true_needs_a_server_backend(scripted):
    with pytest.raises(ValueError, match="trace=True"):
        qa.run(question="x", backend=scripted(), trace=True)


def test_a_failed_call_is_recorded_with_its_error(scripted):
    def boom(prompt, params):
        raise RuntimeError("backend down")

    state = qa.run(question="x", backend=scripted(reply=boom), stream=True)
    assert isinstance(state.error(), RuntimeError)
    calls = state.stream_executor.trace.export().calls  # trace() itself re-raises the run's error
    assert [(c.kind, c.error) for c in calls] == [("gen", "RuntimeError: backend down")]


def test_cached_tokens_come_from_the_engine(tiny_llama_dir, tmp_path):
    """The in-process Engine: each gen's prompt and cached tokens are the server's meta_info numbers; the
    few-shot prefix is cached for the later items of a batch."""
    from radixlm.runtime.engine import Engine

    engine = Engine(model_path=str(tiny_llama_dir))
    try:
        states = qa.run_batch([{"question": f"Capital of {c}?"} for c in ("Peru", "Chile", "Cuba", "Laos")],
                              backend=engine, num_threads=1)
        trace = states[0].trace()
        gens = [c for c in trace.calls if c.kind == "gen"]
        assert len(gens) == 4 and all(c.prompt_tokens and c.completion_tokens for c in gens)
        assert all(c.cached_tokens > 0 for c in gens[1:])  # the shared few-shot prefix hit the cache
        selects = [c for c in trace.calls if c.kind == "select"]
        assert all(c.prompt_tokens and c.cached_tokens is not None for c in selects)
        assert states[0].save_trace(tmp_path / "engine.html").stat().st_size > 1000
    finally:
        engine.shutdown()


def test_opentelemetry_spans(scripted):
    sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk is not installed (extra `otel`)")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    state = branches.run(backend=scripted())
    state.export_otel(tracer_provider=provider)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root = spans["radixlm.program branches"]
    gens = [s for s in exporter.get_finished_spans() if s.name == "radixlm.gen a"]
    assert len(gens) == 2
    states = {s.context.span_id: s for s in exporter.get_finished_spans() if s.name == "radixlm.state"}
    for gen in gens:  # gen -> its branch's state -> the root state -> the program
        branch = states[gen.parent.span_id]
        parent_state = states[branch.parent.span_id]
        assert parent_state.parent.span_id == root.context.span_id
        assert root.start_time <= gen.start_time <= gen.end_time <= root.end_time
    assert all(s.context.trace_id == root.context.trace_id for s in exporter.get_finished_spans())
