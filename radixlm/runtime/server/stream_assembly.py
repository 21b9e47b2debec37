"""Reassemble streamed deltas into the native (cumulative) response shape.

Runs in the HTTP process, on the tokenizer manager's event loop. The detokenizer sends a streaming
request's updates as deltas (messages.StrOut), so the inter-process wire carries O(new tokens) per update;
SGLang's native stream shape has the cumulative `text` and `output_ids` in every event, and the /v1 routes
read the cumulative text too (they send what is new since their last event), so this puts them back
together before any route sees the update.
"""

from __future__ import annotations

from typing import Any

from radixlm.runtime.messages import StrOut


class StreamAssembler:
    def __init__(self) -> None:
        self._text: dict[str, str] = {}  # rid -> text so far
        self._ids: dict[str, list[int]] = {}  # rid -> output ids so far

    def __len__(self) -> int:
        return len(self._ids)

    def assemble(self, out: StrOut) -> dict[str, Any] | None:
        """The cumulative payload of this update (the final one is whole already: the rid is forgotten)."""
        if out.finished:
            self.forget(out.rid)
            return out.payload
        if not out.delta or out.payload is None:
            return out.payload
        text = self._text[out.rid] = self._text.get(out.rid, "") + out.payload["text"]
        ids = self._ids.setdefault(out.rid, [])
        if out.num_rollback:
            del ids[len(ids) - out.num_rollback :]
        ids.extend(out.payload["output_ids"])
        return {**out.payload, "text": text, "output_ids": list(ids)}

    def forget(self, rid: str) -> None:
        self._text.pop(rid, None)
        self._ids.pop(rid, None)
