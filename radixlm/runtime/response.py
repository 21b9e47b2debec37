"""ResponseState: per-request text and meta_info assembled from the scheduler's TokenOuts, in the native
/generate shape of wire-protocol.md. Runs in the detokenizer (server) or the Engine's user process.

Text rules: stop strings and stop_regex matches are trimmed from the final text (unless no_stop_trim), a
matched stop token (eos or stop_token_ids) is left out of the text, and while streaming, a tail that could
still become a stop string or a stop_regex match is held back so streamed text never has to be taken back.
"""

from __future__ import annotations

import time
from typing import Any

from radixlm.constrained.validate import JsonCheck, check_json_output
from radixlm.runtime.generate_input import PreparedReq
from radixlm.runtime.incremental_detok import (IncrementalDecoder, find_stop, find_stop_regex, holdback_len,
                                               regex_holdback_len)
from radixlm.runtime.messages import FinishReason, RequestError, TokenOut


class ResponseState:
    def __init__(self, rid: str, prepared: PreparedReq, tokenizer, child: int = 0):
        self.rid = rid
        self.child = child  # index among the n copies of one prompt (copy i samples with seed + i)
        self.prepared = prepared
        self.params = prepared.params
        self.tokenizer = tokenizer
        self.decoder = IncrementalDecoder(tokenizer, prepared.msg.input_ids, self.params.skip_special_tokens,
                                          self.params.spaces_between_special_tokens)
        self.output_ids: list[int] = []
        self.text = ""
        self.finish: FinishReason | None = None
        self.error: RequestError | None = None  # set when the request was refused or failed
        self.last: TokenOut | None = None
        self.json_check: JsonCheck | None = None  # set when a json_schema request finishes
        # The detokenizer checks in worker processes (check_pool.py) and sets json_check itself.
        self.defer_json_check = False
        self.start = time.perf_counter()
        self.logprobs: dict[str, list] = {k: [] for k in (
            "input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs",
            "output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")}
        self._new_output_logprobs = 0  # entries added by the latest update (streaming sends only those)

    @property
    def finished(self) -> bool:
        return self.finish is not None

    def update(self, out: TokenOut) -> None:
        self.last = out
        if out.error is not None:
            self.error = out.error
        if out.num_rollback:
            self._rollback(out.num_rollback)
        self.output_ids.extend(out.new_ids)
        text_ids = out.new_ids
        finish = out.finish
        stop_token = finish is not None and finish.type == "stop" and isinstance(finish.matched, int)
        if stop_token and not self.params.no_stop_trim and text_ids:
            text_ids = text_ids[:-1]  # the matched stop token is not part of the text
        before = len(self.decoder.text)
        self.decoder.push(text_ids)
        if finish is not None:
            self.decoder.flush()
        self.text = self.decoder.text
        if finish is not None and finish.type == "stop" and isinstance(finish.matched, str):
            if not self.params.no_stop_trim:
                hit = self._find_matched(finish.matched, before)
                if hit is not None:
                    self.text = self.text[: hit[1]]
        self.finish = finish
        if self.needs_json_check() and not self.defer_json_check:
            self.json_check = check_json_output(self.params.json_schema, self.text, finish.type != "length")
        self._add_logprobs(out)

    def needs_json_check(self) -> bool:
        """Finished (not aborted, not failed) with a json_schema: the output is checked against it."""
        finish = self.finish
        return finish is not None and finish.type != "abort" and self.error is None and bool(self.params.json_schema)

    def _find_matched(self, matched: str, before: int) -> tuple[str, int] | None:
        """Where the scheduler's stop string (or stop_regex, named by its pattern) matched, in the same
        text: the search both sides share (incremental_detok.py)."""
        if matched in self.params.stop or matched not in self.params.stop_regex:
            return find_stop(self.text, [matched], before)
        try:
            return find_stop_regex(self.text, [matched], before)
        except TimeoutError:
            return None

    def _rollback(self, num: int) -> None:
        """Jump-forward re-tokenized the tail: rebuild the decoder on the surviving ids. The text that
        comes out is a prefix of the final text, so nothing already streamed changes."""
        del self.output_ids[len(self.output_ids) - num :]
        self.decoder = IncrementalDecoder(self.tokenizer, self.prepared.msg.input_ids,
                                          self.params.skip_special_tokens,
                                          self.params.spaces_between_special_tokens)
        self.decoder.push(self.output_ids)

    def _add_logprobs(self, out: TokenOut) -> None:
        lp = self.logprobs
        with_text = self.prepared.return_text_in_logprobs
        lp["input_token_logprobs"] += [self._entry(e, with_text) for e in out.input_logprobs]
        lp["input_top_logprobs"] += [self._top(t, with_text) for t in out.input_top_logprobs]
        lp["input_token_ids_logprobs"] += [self._top(t, with_text) for t in out.input_ids_logprobs]
        lp["output_token_logprobs"] += [self._entry(e, with_text) for e in out.output_logprobs]
        lp["output_top_logprobs"] += [self._top(t, with_text) for t in out.output_top_logprobs]
        lp["output_token_ids_logprobs"] += [self._top(t, with_text) for t in out.output_ids_logprobs]
        self._new_output_logprobs = len(out.output_logprobs)

    def _entry(self, entry, with_text: bool) -> list:
        logprob, tid = entry
        return [logprob, tid, self.tokenizer.decode([tid]) if with_text else None]

    def _top(self, top, with_text: bool):
        return None if top is None else [self._entry(e, with_text) for e in top]

    def visible_text(self) -> str:
        """Streaming: the text minus a tail that might still turn into a stop string."""
        if self.finished or not (self.params.stop or self.params.stop_regex):
            return self.text
        held = max(holdback_len(self.text, self.params.stop), regex_holdback_len(self.text, self.params.stop_regex))
        return self.text[: len(self.text) - held]

    def to_dict(self, streaming: bool = False) -> dict[str, Any]:
        msg, last = self.prepared.msg, self.last
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish.to_json() if self.finish else None,
            "prompt_tokens": len(msg.input_ids),
            "completion_tokens": len(self.output_ids),
            "cached_tokens": last.cached_tokens if last else 0,
            "e2e_latency": time.perf_counter() - self.start,
        }
        if last is not None and last.num_jump_forward_tokens:
            meta["jump_forward_tokens"] = last.num_jump_forward_tokens
        if last is not None and last.num_spec_proposed:
            meta["spec_proposed_tokens"] = last.num_spec_proposed
            meta["spec_accepted_tokens"] = last.num_spec_accepted
        if self.json_check is not None:
            meta.update(self.json_check.to_meta())
        if msg.return_logprob:
            meta.update(self._logprob_meta(streaming))
        out = {"text": self.visible_text() if streaming else self.text, "output_ids": list(self.output_ids),
               "meta_info": meta}
        if msg.embed:  # little-endian float32 bytes (None if the request failed); the API shapes decode them
            out["embedding"] = last.embedding if last else None
        return out

    def _logprob_meta(self, streaming: bool) -> dict[str, Any]:
        lp, msg = self.logprobs, self.prepared.msg
        keys = ["input_token_logprobs", "output_token_logprobs"]
        if msg.top_logprobs_num > 0:
            keys += ["input_top_logprobs", "output_top_logprobs"]
        if msg.token_ids_logprob is not None:
            keys += ["input_token_ids_logprobs", "output_token_ids_logprobs"]
        out = {k: lp[k] for k in keys}
        if streaming:  # output logprobs: only the new entries; the cumulative count alongside
            n = self._new_output_logprobs
            for k in keys:
                if k.startswith("output_"):
                    out[k] = lp[k][len(lp[k]) - n :] if n else []
            out["output_token_logprobs_length"] = len(lp["output_token_logprobs"])
        return out
