"""`radixlm chat`: the interactive loop over an Engine. Runs in the user's process.

Ctrl-C while a reply streams stops that reply (the request is aborted, its KV freed) and returns to the
prompt: small models loop easily, so this is the common way a reply ends. Ctrl-C at the prompt, Ctrl-D or
an empty line quits; `/reset` forgets the conversation (the system prompt stays).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, TextIO

HELP = "radixlm chat: Ctrl-C stops a reply; /reset starts over; an empty line, Ctrl-C or Ctrl-D quits."


def stream_reply(engine, prompt: str, params: dict[str, Any], out: TextIO = sys.stdout) -> tuple[str, dict, bool]:
    """Print the reply as it streams; (text, meta_info, stopped by Ctrl-C)."""
    printed = ""
    last: dict[str, Any] = {}
    stream = engine.generate(prompt, params, stream=True)
    try:
        for chunk in stream:
            text = chunk["text"]
            out.write(text[len(printed):])
            out.flush()
            printed, last = text, chunk
    except KeyboardInterrupt:
        stream.close()  # aborts the request in the engine (its KV is freed)
        out.write("\n")
        return printed, last.get("meta_info", {}), True
    out.write("\n")
    return printed, last.get("meta_info", {}), False


def run_chat(engine, system: str | None, params: dict[str, Any], read: Callable[[str], str] = input,
             out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    print(HELP, file=err)
    while True:
        try:
            line = read("> ").strip()
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            return 0
        if not line:
            return 0
        if line == "/reset":
            messages = list(start)
            print("[conversation reset]", file=err)
            continue
        messages.append({"role": "user", "content": line})
        prompt = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        reply, meta, stopped = stream_reply(engine, prompt, params, out)
        messages.append({"role": "assistant", "content": reply})  # what the user saw, even if cut short
        note = "stopped; " if stopped else ""
        print(f"[{note}cached {meta.get('cached_tokens', 0)}/{meta.get('prompt_tokens', 0)} prompt tokens]",
              file=err)
