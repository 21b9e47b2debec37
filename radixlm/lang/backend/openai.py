"""OpenAI: the frontend backend for any OpenAI-compatible /v1 server, through the `openai` package.

Runs in the user's process. A `gen` right after an assistant role opens (and nothing else appended)
goes to /v1/chat/completions with the conversation's messages, so the server applies the model's own
template; everything else goes to /v1/completions with the prompt text. `is_chat_model=True` forces
chat (a gen elsewhere is an error, as in SGLang); `False` forces completions.

select: scored with echoed prompt logprobs (`echo=True, logprobs=1` on /v1/completions), exactly like
the native backends score it. Fallback when the server does not return prompt logprobs (chat-only
APIs, servers without echo): generate greedily and take the choice the completion starts with, or
shares the longest prefix with (ties: the earlier choice); meta_info then says
`{"fallback": "generation", "completion": ...}`.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

from radixlm.lang.backend.base import BaseBackend
from radixlm.lang.chat_template import ChatTemplate, get_chat_template_by_model_path
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod, normalized_logprob
from radixlm.lang.interpreter import StreamExecutor
from radixlm.lang.params import GenParams, stop_list
from radixlm.lang.tools import openai_tool_calls, parse_tool_calls, tool_params


class NoPromptLogprobs(Exception):
    """The server did not echo prompt logprobs."""


def _extensions(params: GenParams) -> dict[str, Any]:
    """radixlm/SGLang /v1 extensions, sent only when they differ from the default (plain OpenAI rejects them)."""
    p = params.sampling
    values = {"top_k": p.top_k if p.top_k not in (None, -1) else None,
              "min_p": p.min_p or None, "min_tokens": p.min_new_tokens or None,
              "stop_token_ids": list(p.stop_token_ids) if p.stop_token_ids else None,
              "ignore_eos": p.ignore_eos or None, "regex": p.regex, "json_schema": p.json_schema}
    return {k: v for k, v in values.items() if v is not None}


class OpenAI(BaseBackend):
    def __init__(self, model_name: str, base_url: str | None = None, api_key: str | None = None,
                 is_chat_model: bool | None = None, chat_template: ChatTemplate | None = None,
                 **client_kwargs: Any):
        import openai

        super().__init__()
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY", "EMPTY"),
                                    **client_kwargs)
        self.model_name = model_name
        self.force_chat = is_chat_model
        self.is_chat_model = bool(is_chat_model)
        self.chat_template = chat_template or get_chat_template_by_model_path(model_name)

    def get_model_name(self) -> str:
        return self.model_name

    def _use_chat(self, s: StreamExecutor) -> bool:
        at_assistant_start = s.cur_role == "assistant" and s.text_[s.cur_role_begin_pos:] == ""
        if self.force_chat and not at_assistant_start:
            raise RuntimeError("for a chat model, gen must come right after the assistant role opens")
        return at_assistant_start if self.force_chat is None else self.force_chat

    def _kwargs(self, params: GenParams) -> dict[str, Any]:
        p = params.sampling
        kwargs: dict[str, Any] = {"model": self.model_name, "max_tokens": p.max_new_tokens,
                                  "temperature": p.temperature, "top_p": p.top_p, "n": p.n,
                                  "frequency_penalty": p.frequency_penalty, "presence_penalty": p.presence_penalty}
        if stop_list(p.stop):
            kwargs["stop"] = stop_list(p.stop)
        if params.tools:
            kwargs["tools"] = list(params.tools)
            if params.tool_choice is not None:
                kwargs["tool_choice"] = params.tool_choice
        extra = _extensions(params)
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def generate(self, s: StreamExecutor, params: GenParams) -> tuple[str | list[str], dict[str, Any]]:
        kwargs = self._kwargs(params)
        if self._use_chat(s):
            ret = self.client.chat.completions.create(messages=s.messages_, **kwargs)
            texts = [c.message.content or "" for c in ret.choices]
            tool_calls = openai_tool_calls(ret.choices[0].message) if params.tools else None
        else:
            tool_calls = None
            if params.tools:  # completions have no tools field: the grammar and the parse run here
                kwargs.pop("tools", None), kwargs.pop("tool_choice", None)
                extra = kwargs.get("extra_body", {})
                extra = {**extra, **tool_params(params.tools, params.tool_choice, extra.get("stop_regex"))}
                if extra:
                    kwargs["extra_body"] = extra
            if params.return_logprob:
                kwargs["logprobs"] = max(params.top_logprobs_num or 0, 1)
            ret = self.client.completions.create(prompt=s.text_, **kwargs)
            texts = [c.text for c in ret.choices]
        meta: dict[str, Any] = {"finish_reason": ret.choices[0].finish_reason}
        if params.tools:
            meta["tool_calls"] = tool_calls if tool_calls is not None else parse_tool_calls(
                texts[0], params.tools, params.tool_choice)
        if ret.usage is not None:
            meta.update(prompt_tokens=ret.usage.prompt_tokens, completion_tokens=ret.usage.completion_tokens)
        logprobs = getattr(ret.choices[0], "logprobs", None)
        if params.return_logprob and logprobs is not None and getattr(logprobs, "tokens", None):
            meta["output_token_logprobs"] = [[lp, None, tok] for lp, tok in zip(logprobs.token_logprobs, logprobs.tokens)]
        return (texts if len(texts) > 1 else texts[0]), meta

    def generate_stream(self, s: StreamExecutor, params: GenParams) -> Iterator[tuple[str, dict[str, Any]]]:
        kwargs = self._kwargs(params)
        if self._use_chat(s):
            for chunk in self.client.chat.completions.create(messages=s.messages_, stream=True, **kwargs):
                if chunk.choices and chunk.choices[0].delta.content:
                    yield chunk.choices[0].delta.content, {}
        else:
            for chunk in self.client.completions.create(prompt=s.text_, stream=True, **kwargs):
                if chunk.choices and chunk.choices[0].text:
                    yield chunk.choices[0].text, {}

    # ---- select -------------------------------------------------------------------------------
    def select(self, s: StreamExecutor, choices: list[str], temperature: float,
               choices_method: ChoicesSamplingMethod) -> ChoicesDecision:
        if temperature > 1e-5:
            raise ValueError("select: only temperature 0 is supported (choices are scored, not sampled)")
        import openai

        try:
            if self.force_chat:
                raise NoPromptLogprobs("chat model")
            inputs = self._echo_logprobs(s.text_, choices)
            unconditional = self._echo_logprobs("", choices) if choices_method.requires_unconditional_logprobs else None
        except (NoPromptLogprobs, openai.BadRequestError, openai.UnprocessableEntityError, openai.NotFoundError):
            return self._select_by_generation(s, choices)
        return choices_method(choices=choices, normalized_prompt_logprobs=[normalized_logprob(e) for e in inputs],
                              input_token_logprobs=inputs, output_token_logprobs=[[] for _ in choices],
                              unconditional_token_logprobs=unconditional)

    def _echo_logprobs(self, prefix: str, choices: list[str]) -> list[list[list[Any]]]:
        """Per choice, [logprob, None, token] for the tokens overlapping the choice's characters."""
        ret = self.client.completions.create(model=self.model_name, prompt=[prefix + c for c in choices],
                                             max_tokens=1, temperature=0, echo=True, logprobs=1)
        by_index = sorted(ret.choices, key=lambda c: c.index)
        out = []
        for choice, result in zip(choices, by_index):
            lp = result.logprobs
            if lp is None or not lp.tokens or lp.token_logprobs is None:
                raise NoPromptLogprobs("server returned no prompt logprobs")
            offsets = lp.text_offset or _offsets(lp.tokens)
            lo, hi = len(prefix), len(prefix) + len(choice)
            # A token straddling the prefix/choice boundary counts for the choice (token healing).
            out.append([[lp.token_logprobs[i], None, tok] for i, (tok, off) in enumerate(zip(lp.tokens, offsets))
                        if off < hi and off + len(tok) > lo])
        return out

    def _select_by_generation(self, s: StreamExecutor, choices: list[str]) -> ChoicesDecision:
        params = GenParams.override(max_new_tokens=max(len(c) for c in choices) + 2, temperature=0.0)
        completion, _ = self.generate(s, params)
        text = completion[0] if isinstance(completion, list) else completion
        text = text.lstrip() if s.cur_role == "assistant" else text

        def shared(c: str) -> int:
            n = 0
            while n < min(len(c), len(text)) and c[n] == text[n]:
                n += 1
            return n + (len(c) + 1 if text.startswith(c) else 0)  # a full match beats any partial one

        best = max(range(len(choices)), key=lambda i: (shared(choices[i]), -i))
        return ChoicesDecision(choices[best], {"fallback": "generation", "completion": text})


def _offsets(tokens: list[str]) -> list[int]:
    offsets, pos = [], 0
    for tok in tokens:
        offsets.append(pos)
        pos += len(tok)
    return offsets
