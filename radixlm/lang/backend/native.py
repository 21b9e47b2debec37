"""The native-API protocol the frontend speaks, shared by RuntimeEndpoint (HTTP) and Engine (in-process).

Runs in the user's process. Requests are the dicts native /generate takes and responses the dicts it
returns (docs/wire-protocol.md); only the transport differs between the two backends.
The call sequence matches the stock SGLang frontend, so a server sees the same traffic from both:
gen -> one /generate; select -> prefix prefill, one batched scoring request with
logprob_start_len = L-2, and (unconditional scoring only) an input_ids request; fork -> a
max_new_tokens 0 commit of the prefix; run_batch -> a max_new_tokens 0 prefill of the traced prefix.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol

from radixlm.lang.backend.base import BaseBackend
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod, normalized_logprob
from radixlm.lang.interpreter import StreamExecutor
from radixlm.lang.params import GenParams

Entry = list[Any]  # [logprob | None, token_id, text | None]


class NativeTransport(Protocol):
    """Moves native-API dicts; raises on any failure (a non-2xx answer, a dead engine)."""

    def generate(self, payload: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]: ...

    def generate_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]: ...

    def flush_cache(self) -> Any: ...

    def server_info(self) -> dict[str, Any]: ...

    def concate_and_append(self, src_rids: list[str], dst_rid: str) -> None: ...


def _prefill_payload(text: str) -> dict[str, Any]:
    return {"text": text, "sampling_params": {"max_new_tokens": 0}}


def gen_payload(text: str, params: GenParams) -> dict[str, Any]:
    """The /generate request for one `gen` (the stock frontend's field set)."""
    return {"text": text, "sampling_params": params.to_native_sampling_params(), **params.logprob_fields()}


def choice_token_entries(entries: list[Entry], choice: str, num_prefix_entries: int = 2) -> list[Entry]:
    """The logprob entries of the tokens that spell `choice` at the end of a scored prompt.

    `entries` covers the prompt from two tokens before the end of the prefix. The choice's tokens are
    the shortest suffix whose text covers the choice: when the tokenizer merged the prefix's last
    characters with the choice's first ones (no clean boundary), the merged token belongs to the
    choice, as it does in SGLang's token-healing adjustment. Without token texts, the first
    `num_prefix_entries` entries are taken to be the prefix.
    """
    if any(e[2] is None for e in entries):
        return entries[min(num_prefix_entries, max(len(entries) - 1, 0)):]
    covered, start = 0, len(entries)
    while start > 0 and covered < len(choice):
        start -= 1
        covered += len(entries[start][2])
    return entries[start:]


def _with_tool_calls(params: GenParams, obj: dict[str, Any]) -> dict[str, Any]:
    """meta_info, plus the parsed `tool_calls` when the gen had tools."""
    if not params.tools:
        return obj["meta_info"]
    from radixlm.lang.tools import parse_tool_calls

    return {**obj["meta_info"], "tool_calls": parse_tool_calls(obj["text"], params.tools, params.tool_choice)}


class NativeBackend(BaseBackend):
    """A backend over a native-API transport."""

    def __init__(self, transport: NativeTransport, model_path: str, chat_template: ChatTemplate):
        super().__init__()
        self.transport = transport
        self.model_path = model_path
        self.chat_template = chat_template

    def get_model_name(self) -> str:
        return self.model_path

    # ---- generation ---------------------------------------------------------------------------
    def generate(self, s: StreamExecutor, params: GenParams) -> tuple[str | list[str], Any]:
        obj = self.transport.generate(gen_payload(s.text_, params))
        if isinstance(obj, list):  # n > 1: one result per sample
            return [o["text"] for o in obj], [_with_tool_calls(params, o) for o in obj]
        return obj["text"], _with_tool_calls(params, obj)

    def generate_stream(self, s: StreamExecutor, params: GenParams) -> Iterator[tuple[str, dict[str, Any]]]:
        payload = {**gen_payload(s.text_, params), "stream": True}
        pos = 0
        for chunk in self.transport.generate_stream(payload):
            # Streamed text is cumulative; hand the interpreter only what is new.
            text = chunk["text"]
            yield text[pos:], _with_tool_calls(params, chunk) if chunk["meta_info"].get("finish_reason") \
                else chunk["meta_info"]
            pos = len(text)

    def select(self, s: StreamExecutor, choices: list[str], temperature: float,
               choices_method: ChoicesSamplingMethod) -> ChoicesDecision:
        if temperature > 1e-5:
            raise ValueError("select: only temperature 0 is supported (choices are scored, not sampled)")
        prefix = s.text_
        prefill = self.transport.generate(_prefill_payload(prefix))["meta_info"]
        s.note_usage(prefill)  # the trace's prompt and cached tokens of this select
        prompt_len = prefill["prompt_tokens"]
        scored = self.transport.generate({
            "text": [prefix + c for c in choices],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "return_text_in_logprobs": True,
            # Two tokens back, so a token merged across the prefix/choice boundary is scored too.
            "logprob_start_len": max(prompt_len - 2, 0),
        })
        inputs = [choice_token_entries(r["meta_info"]["input_token_logprobs"], c,
                                       min(2, prompt_len)) for r, c in zip(scored, choices)]
        outputs = [r["meta_info"].get("output_token_logprobs", []) for r in scored]
        unconditional = None
        if choices_method.requires_unconditional_logprobs:
            unconditional = self._unconditional(inputs)
        return choices_method(choices=choices, normalized_prompt_logprobs=[normalized_logprob(e) for e in inputs],
                              input_token_logprobs=inputs, output_token_logprobs=outputs,
                              unconditional_token_logprobs=unconditional)

    def _unconditional(self, inputs: list[list[Entry]]) -> list[list[Entry]]:
        # logprob_start_len 0: score every token of the choice on its own (the first has no context).
        objs = self.transport.generate({
            "input_ids": [[e[1] for e in entries] for entries in inputs],
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
        })
        return [o["meta_info"]["input_token_logprobs"] for o in objs]

    # ---- cache management ---------------------------------------------------------------------
    def cache_prefix(self, prefix: str) -> None:
        self.transport.generate(_prefill_payload(prefix))

    def commit_lazy_operations(self, s: StreamExecutor) -> None:
        self.transport.generate(_prefill_payload(s.text_))

    def concatenate_and_append(self, src_rids: list[str], dst_rid: str) -> None:
        self.transport.concate_and_append(src_rids, dst_rid)

    def flush_cache(self) -> Any:
        return self.transport.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        return self.transport.server_info()
