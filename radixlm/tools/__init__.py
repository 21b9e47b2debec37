"""OpenAI tool calling for /v1/chat/completions (docs/server.md, "Tool calling").

Runs in the HTTP process and, for `gen(..., tools=...)`, in the user's process (lang/tools.py): it needs
nothing above radixlm.constrained, so both can import it. spec.py validates `tools` / `tool_choice`; formats.py holds each model family's
call syntax and its parser; grammar.py builds the llguidance grammar that makes every call well-formed;
prompt.py renders tools and tool turns for templates without tool syntax; stream.py turns growing text
into OpenAI tool-call deltas; plan.py ties them to one request.
"""
