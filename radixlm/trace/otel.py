"""A program trace as OpenTelemetry spans (optional: `pip install radixlm[otel]`, i.e. opentelemetry-sdk).

Runs in the user's process. One root span for the run ("radixlm.program <name>"), one span per program
state under its parent's (a run_batch item under the root, a fork branch under the state it forked from),
and one span per call under its state, with the call's real start and end times and its token counts as
attributes (radixlm.prompt_tokens, radixlm.cached_tokens, radixlm.completion_tokens, ...). The spans go to
the given tracer provider, else the global one, so they join whatever tracing the user already runs.
"""

from __future__ import annotations

from typing import Any

from radixlm.trace.schema import ProgramTrace

_NS = 1_000_000_000


def export_spans(trace: ProgramTrace, tracer_provider: Any = None) -> None:
    try:
        from opentelemetry import trace as otel
    except ImportError:
        raise ImportError("OpenTelemetry export needs opentelemetry-sdk: pip install 'radixlm[otel]'") from None
    tracer = otel.get_tracer("radixlm.lang", tracer_provider=tracer_provider)
    start = int(trace.started_at * _NS)
    at = lambda seconds: start + int(seconds * _NS)  # noqa: E731 - trace times are seconds since its start
    root = tracer.start_span(f"radixlm.program {trace.name}", start_time=start,
                             attributes={"radixlm.trace_id": trace.id, "radixlm.backend": trace.backend,
                                         "radixlm.num_states": len(trace.states)})
    calls_by_state: dict[str, list] = {}
    for call in trace.calls:
        calls_by_state.setdefault(call.state, []).append(call)
    spans: dict[str, Any] = {}
    for state in trace.states:  # parents are registered before their branches
        parent = spans.get(state.parent, root) if state.parent else root
        own = calls_by_state.get(state.id, [])
        first = min([c.start for c in own], default=0.0)
        attrs = {"radixlm.state": state.id, **({"radixlm.item": state.item} if state.item is not None else {})}
        span = tracer.start_span("radixlm.state", context=otel.set_span_in_context(parent), start_time=at(first),
                                 attributes=attrs)
        spans[state.id] = span
        for call in own:
            attributes = {k: v for k, v in {
                "radixlm.kind": call.kind, "radixlm.name": call.name, "radixlm.prompt_chars": call.prompt_end,
                "radixlm.output_chars": call.output_end - call.prompt_end, "radixlm.prompt_tokens": call.prompt_tokens,
                "radixlm.cached_tokens": call.cached_tokens, "radixlm.completion_tokens": call.completion_tokens,
                "radixlm.finish_reason": call.finish, "radixlm.error": call.error}.items() if v is not None}
            child = tracer.start_span(f"radixlm.{call.kind}" + (f" {call.name}" if call.name else ""),
                                      context=otel.set_span_in_context(span), start_time=at(call.start),
                                      attributes=attributes)
            if call.error:
                child.set_status(otel.Status(otel.StatusCode.ERROR, call.error))
            child.end(end_time=at(call.end))
        span.end(end_time=at(max([c.end for c in own], default=first)))
    root.end(end_time=at(trace.duration))
