"""Chat templates for role blocks (`s += user(...)`): per-role prefix/suffix strings.

Runs in the user's process. The interpreter builds the prompt as plain text, so a template is reduced
to the text before and after each role's content. Preferred source: the model's own jinja template
(the server reports it in /get_model_info, the in-process engine's tokenizer has it), reduced by
rendering conversations with sentinel contents through transformers' renderer. Fallback: a registry
of known templates matched by model path, as SGLang's frontend does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    # role -> (prefix, suffix) for a message that is not the first of the conversation.
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    # role -> prefix when the message opens the conversation (e.g. a BOS or a header the template adds once).
    first_prefix: dict[str, str] = field(default_factory=dict)
    stop_str: tuple[str, ...] = ()
    default_system_prompt: str | None = None
    image_token: str = "<image>"

    def get_prefix_and_suffix(self, role: str, hist_messages: list[dict[str, Any]]) -> tuple[str, str]:
        if role not in self.role_prefix_and_suffix:
            raise ValueError(f"chat template {self.name!r} has no role {role!r}")
        prefix, suffix = self.role_prefix_and_suffix[role]
        if not hist_messages and role in self.first_prefix:
            prefix = self.first_prefix[role]
        return prefix, suffix


def _same_for_all(prefix_fmt: str, suffix: str) -> dict[str, tuple[str, str]]:
    return {role: (prefix_fmt.format(role=role), suffix) for role in ROLES}


_REGISTRY: dict[str, ChatTemplate] = {
    "default": ChatTemplate("default", {"system": ("SYSTEM:", "\n"), "user": ("USER:", "\n"),
                                        "assistant": ("ASSISTANT:", "\n")}),
    # For chat-only APIs the server applies the template; the local text only tracks the content.
    "chatgpt": ChatTemplate("chatgpt", _same_for_all("", "")),
    "chatml": ChatTemplate("chatml", _same_for_all("<|im_start|>{role}\n", "<|im_end|>\n"),
                           stop_str=("<|im_end|>",)),
    "qwen": ChatTemplate("qwen", _same_for_all("<|im_start|>{role}\n", "<|im_end|>\n"),
                         stop_str=("<|im_end|>",), default_system_prompt="You are a helpful assistant."),
    "llama-3-instruct": ChatTemplate(
        "llama-3-instruct", _same_for_all("<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>"),
        stop_str=("<|eot_id|>",)),
}

# Model-path substrings -> template name; first match wins, so specific patterns come first.
_PATH_RULES: list[tuple[Callable[[str], bool], str]] = [
    (lambda p: "llama-3" in p and "instruct" in p, "llama-3-instruct"),
    (lambda p: "llama3" in p and "instruct" in p, "llama-3-instruct"),
    (lambda p: "qwen" in p, "qwen"),
    (lambda p: any(k in p for k in ("smollm", "chatml", "hermes", "yi-", "tinyllama")), "chatml"),
]


def register_chat_template(template: ChatTemplate) -> None:
    _REGISTRY[template.name] = template


def get_chat_template(name: str) -> ChatTemplate:
    if name not in _REGISTRY:
        raise ValueError(f"unknown chat template {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def get_chat_template_by_model_path(model_path: str) -> ChatTemplate:
    path = model_path.lower()
    for matches, name in _PATH_RULES:
        if matches(path):
            return _REGISTRY[name]
    return _REGISTRY["default"]


def resolve_chat_template(model_path: str, jinja_template: str | None, **special_tokens: str) -> ChatTemplate:
    """The model's own template when it can be reduced to prefix/suffix form, else the registry's match."""
    if jinja_template:
        try:
            return template_from_jinja(jinja_template, name=model_path, **special_tokens)
        except TemplateReductionError:
            pass
    return get_chat_template_by_model_path(model_path)


# ---- reduction of a jinja template --------------------------------------------------------------
class TemplateReductionError(ValueError):
    """The jinja template does not behave like fixed per-role prefix/suffix strings."""


# Mixed case, so a template that changes case (upper/lower/title) is detected as rewriting content.
_S, _U1, _A1, _U2 = "rlmSentinelSys", "rlmSentinelUserA", "rlmSentinelAssistant", "rlmSentinelUserB"


def _render(template: str, messages: list[dict[str, str]], add_generation_prompt: bool,
            special_tokens: dict[str, str]) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        rendered, _ = render_jinja_template([messages], chat_template=template,
                                            add_generation_prompt=add_generation_prompt, **special_tokens)
    except Exception as e:  # templates raise on shapes they reject (e.g. no system role)
        raise TemplateReductionError(f"template rejected {[m['role'] for m in messages]}: {e}") from e
    return rendered[0]


def _between(text: str, start: str | None, end: str | None) -> str:
    i = 0 if start is None else text.index(start) + len(start)
    j = len(text) if end is None else text.index(end, i)
    return text[i:j]


def _strip_prefix(text: str, prefix: str) -> str:
    if not text.startswith(prefix):
        raise TemplateReductionError(f"{text!r} does not start with {prefix!r}")
    return text[len(prefix):]


def _strip_suffix(text: str, suffix: str) -> str:
    if suffix and not text.endswith(suffix):
        raise TemplateReductionError(f"{text!r} does not end with {suffix!r}")
    return text[: len(text) - len(suffix)]


def _msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def template_from_jinja(template: str, name: str = "model", **special_tokens: str) -> ChatTemplate:
    """Reduce a jinja chat template to prefix/suffix strings by rendering sentinel conversations.

    `special_tokens` (bos_token, eos_token, ...) are passed to the template; leave `bos_token` out
    when the tokenizer adds BOS itself, so the prompt text does not carry a second one.
    """
    # transformers renders with StrictUndefined: a token the caller leaves out renders as "".
    special_tokens = {"bos_token": "", "eos_token": "", **special_tokens}

    def render(msgs: list[dict[str, str]], gen: bool = False) -> str:
        return _render(template, msgs, gen, special_tokens)

    try:
        u1, a1, u2 = _msg("user", _U1), _msg("assistant", _A1), _msg("user", _U2)
        chat = render([u1, a1, u2])
        suffix_user = _between(chat, _U2, None)
        prefix_asst = _strip_prefix(_between(chat, _U1, _A1), suffix_user)
        suffix_asst = _between(render([u1, a1]), _A1, None)
        prefix_user = _strip_prefix(_between(chat, _A1, _U2), suffix_asst)
        first_user = _between(chat, None, _U1)
        roles = {"user": (prefix_user, suffix_user), "assistant": (prefix_asst, suffix_asst)}
        first = {"user": first_user}
        default_system, system = _reduce_system(render, prefix_user, first_user)
        roles["system"] = system[0] if system else roles["user"]
        first["system"] = system[1] if system else first_user
    except ValueError as e:  # str.index failures: a sentinel vanished (template rewrites content)
        raise TemplateReductionError(str(e)) from e
    stop = (suffix_asst.strip(),) if suffix_asst.strip() else ()
    return ChatTemplate(name, roles, first_prefix=first, stop_str=stop, default_system_prompt=default_system)


def _reduce_system(render: Callable[..., str], prefix_user: str,
                   first_user: str) -> tuple[str | None, tuple[tuple[str, str], str] | None]:
    """System role strings, and the default system prompt the template inserts when none is given."""
    try:
        chat = render([_msg("system", _S), _msg("user", _U1)])
    except TemplateReductionError:
        return None, None  # no system role: the caller maps system onto user
    first_system = _between(chat, None, _S)
    suffix_system = _strip_suffix(_between(chat, _S, _U1), prefix_user)
    # Templates such as Qwen's insert a system block when the conversation starts without one:
    # first_user == first_system + <default> + suffix_system + prefix_user.
    default = None
    if first_user != first_system + suffix_system + prefix_user and first_user.startswith(first_system):
        middle = _strip_suffix(first_user[len(first_system):], suffix_system + prefix_user)
        default = middle or None
    return default, ((first_system, suffix_system), first_system)
