"""Chat messages -> prompt token ids with the model's own chat template, safe against role forgery.

Runs in the HTTP process. A user who types "<|im_start|>system" into a message must not get a real
special token: only the template's own markers may become special tokens. When no message contains a
special-token string, we tokenize the rendered template as usual (identical ids to the common
apply_chat_template path). Otherwise each content is replaced by a unique placeholder before rendering;
the template text around the placeholders is tokenized normally and each content with
split_special_tokens=True, so its special-token strings stay plain text.
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixlm.errors import ContextLengthError, InvalidRequestError
from radixlm.tools.messages import tool_fields

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
_PLACEHOLDER = "\ue000radixlm{}\ue001"  # private-use characters: no template or user text contains them
_PLACEHOLDER_RE = re.compile("\ue000radixlm(\\d+)\ue001")


def normalize_messages(messages: Any, max_chars: int = 1 << 20) -> list[dict[str, Any]]:
    """Validate OpenAI chat messages; content parts of type text are joined into one string. The total
    content is capped at max_chars before anything is rendered or tokenized."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list", param="messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidRequestError(f"messages[{i}] must be an object", param="messages")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:  # a list or object is unhashable: check the type first
            raise InvalidRequestError(f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}",
                                      param="messages")
        out.append({"role": role, "content": _content(msg.get("content"), i, role), **tool_fields(msg, i)})
    if sum(len(m["content"]) for m in out) > max_chars:
        raise ContextLengthError("the messages are too long", param="messages")
    return out


def _content(content: Any, i: int, role: str) -> str:
    if content is None and role == "assistant":
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequestError(f"messages[{i}].content: only parts of type text are supported",
                                          param="messages")
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidRequestError(f"messages[{i}].content must be a string or a list of text parts", param="messages")


def _render(tokenizer, messages: list[dict[str, Any]], tools: Any, add_generation_prompt: bool = True,
            continue_final_message: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             continue_final_message=continue_final_message, tools=tools or None)
    except Exception as exc:  # the template rejected the conversation (e.g. roles must alternate)
        raise InvalidRequestError(f"the chat template rejected the messages ({type(exc).__name__})",
                                  param="messages") from None


def _special_strings(tokenizer) -> list[str]:
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    specials = {t.content for t in added.values() if getattr(t, "special", False)}
    return sorted(specials | set(tokenizer.all_special_tokens))


def chat_input_ids(tokenizer, messages: list[dict[str, Any]], tools: Any = None, add_generation_prompt: bool = True,
                   continue_final_message: bool = False) -> list[int]:
    """The conversation's prompt ids; the options are apply_chat_template's (POST /tokenize passes them)."""
    render = {"add_generation_prompt": add_generation_prompt, "continue_final_message": continue_final_message}
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequestError("this model has no chat template; use /v1/completions", param="messages")
    specials = _special_strings(tokenizer)
    if any(s in json.dumps(m["tool_calls"], ensure_ascii=False) for m in messages if m.get("tool_calls")
           for s in specials):  # the template renders tool calls itself: no placeholders to hide them behind
        raise InvalidRequestError("tool_calls contain special tokens", param="messages",
                                  code="special_tokens_in_content")
    if not any(s in m["content"] for m in messages for s in specials):
        return list(tokenizer(_render(tokenizer, messages, tools, **render), add_special_tokens=False).input_ids)
    masked = [{**m, "content": _PLACEHOLDER.format(i)} for i, m in enumerate(messages)]
    text = _render(tokenizer, masked, tools, **render)
    found = [int(x) for x in _PLACEHOLDER_RE.findall(text)]
    if sorted(found) != list(range(len(messages))):
        # The template altered or duplicated contents; we cannot tell text from markers safely.
        raise InvalidRequestError("message content contains special tokens", param="messages",
                                  code="special_tokens_in_content")
    ids: list[int] = []
    pieces = _PLACEHOLDER_RE.split(text)  # template, index, template, index, ..., template
    for k, piece in enumerate(pieces):
        if k % 2 == 0:
            ids += tokenizer(piece, add_special_tokens=False).input_ids if piece else []
        else:
            content = messages[int(piece)]["content"]
            ids += tokenizer(content, add_special_tokens=False, split_special_tokens=True).input_ids if content else []
    return ids
