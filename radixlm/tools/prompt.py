"""Tools and tool turns for the chat template: the model's own template when it has tool syntax, else the
documented default hermes-style prompt (docs/server.md, "Tool calling").

Runs in the HTTP process. Without template support, the tool list goes into the system message, assistant
calls are written in the family's call syntax and tool results become user turns in <tool_response> tags.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.tools.parsers.base import ToolFormat
from radixlm.tools.spec import ToolSpec

DEFAULT_TOOL_PROMPT = (
    "# Tools\n\nYou may call one or more functions to answer the user. The functions are listed in "
    "<tools></tools> tags as JSON signatures:\n<tools>\n{tools}\n</tools>\n\nTo call a function, write a JSON "
    "object with its name and arguments inside <tool_call></tool_call> tags:\n<tool_call>\n"
    "{{\"name\": <function-name>, \"arguments\": <arguments-object>}}\n</tool_call>")


def template_has_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in chat_template


def format_call(fmt: ToolFormat, name: str, arguments: dict[str, Any]) -> str:
    body = json.dumps({"name": name, fmt.args_key: arguments}, ensure_ascii=False)
    return fmt.call_open + body + fmt.call_close


def _assistant(fmt: ToolFormat, msg: dict[str, Any]) -> dict[str, Any]:
    calls = [format_call(fmt, c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]
    text = fmt.open + fmt.sep.join(calls) + fmt.close
    content = f"{msg['content']}\n{text}" if msg["content"] else text
    return {"role": "assistant", "content": content}


def _tool_result(msg: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": f"<tool_response>\n{msg['content']}\n</tool_response>"}


def default_prompt_messages(messages: list[dict[str, Any]], tools: tuple[ToolSpec, ...], fmt: ToolFormat
                            ) -> list[dict[str, Any]]:
    """Messages for a template without tool syntax: the tool prompt in the system message (a new one
    first when there is none), tool calls and results as plain text turns."""
    out = []
    for msg in messages:
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            out.append(_assistant(fmt, msg))
        elif msg["role"] == "tool":
            out.append(_tool_result(msg))
        else:
            out.append({"role": msg["role"], "content": msg["content"]})
    if tools:
        listing = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
        prompt = DEFAULT_TOOL_PROMPT.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
