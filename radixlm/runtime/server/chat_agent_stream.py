"""The streamed /v1 chat choices of a request with tools or a reasoning parser (chat_agent.ChoiceStream per
choice), in the render shape openai_api._sse_choices expects.

Runs in the HTTP process.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from radixlm.runtime.server import openai_format as fmt
from radixlm.runtime.server.chat_agent import ChatAgent, ChoiceStream


def _choice(index: int, delta: dict[str, Any], reason: Any = None, matched: Any = None, lp: Any = None
            ) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason, "matched_stop": matched}


def agent_chat_choices(agent: ChatAgent, logprobs: bool
                       ) -> Callable[[int, Any, dict[str, Any], str, int], Iterator[dict[str, Any]]]:
    streams: dict[int, ChoiceStream] = {}

    def render(index: int, out: Any, meta: dict[str, Any], delta: str, offset: int) -> Iterator[dict[str, Any]]:
        stream = streams.setdefault(index, agent.stream())
        entries = meta.get("output_token_logprobs", [])
        lp = fmt.chat_logprobs(entries, meta.get("output_top_logprobs")) if logprobs and entries else None
        sent_lp = False
        for piece in stream.feed(out.payload["text"], out.finished):
            yield _choice(index, piece, lp=None if sent_lp else lp)
            sent_lp = True
        if lp and not sent_lp:  # tokens held back (a partial tag) still report their logprobs
            yield _choice(index, {}, lp=lp)
        if out.finished:
            reason, matched = fmt.finish_reason(meta)
            final = _choice(index, {}, stream.finish_reason(reason), matched)
            yield stream.details(fmt.with_finish_details(final, meta))
    return render
