"""Public primitives of the frontend language, with SGLang's names and parameters.

Runs in the user's process. `import radixlm as sgl` makes an SGLang program run unchanged.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from radixlm.lang.choices import ChoicesSamplingMethod, token_length_normalized
from radixlm.lang.global_config import global_config
from radixlm.lang.ir import GenParams, SglExpr, SglExprList, SglGen, SglRoleBegin, SglRoleEnd, SglSelect
from radixlm.lang.program import SglFunction, resolve_backend


def function(func: Callable[..., Any] | None = None, num_api_spec_tokens: int | None = None):
    """Decorator making a program: `@function` or `@function(num_api_spec_tokens=...)`.

    `num_api_spec_tokens` is accepted for compatibility; radixlm does not speculate over chat APIs.
    """
    if func is not None:
        return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)
    return lambda f: SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)


def set_default_backend(backend: Any) -> None:
    """Backend used by programs run without `backend=`: a backend, a Runtime or a radixlm.Engine."""
    global_config.default_backend = backend


def flush_cache(backend: Any = None) -> Any:
    if backend is None and global_config.default_backend is None:
        return False
    return resolve_backend(backend).flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any] | None:
    if backend is None and global_config.default_backend is None:
        return None
    return resolve_backend(backend).get_server_info()


def gen(name: str | None = None, max_tokens: int | None = None, min_tokens: int | None = None,
        n: int | None = None, stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None, temperature: float | None = None,
        top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
        frequency_penalty: float | None = None, presence_penalty: float | None = None,
        ignore_eos: bool | None = None, return_logprob: bool | None = None,
        logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None, dtype: type | str | None = None,
        choices: list[str] | None = None, choices_method: ChoicesSamplingMethod | None = None,
        regex: str | None = None, json_schema: str | dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None, tool_choice: Any = None) -> SglExpr:
    """Generate into variable `name`. Unset parameters inherit the run() defaults.

    With `choices`, this is `select`. `dtype` (int, float, str, bool) constrains the output to that
    type; `regex` / `json_schema` (a JSON string) constrain it to a grammar. `tools` (OpenAI tool dicts)
    and `tool_choice` make calls possible: meta_info["tool_calls"] lists them with arguments as dicts.
    """
    if choices:
        return SglSelect(name, choices, 0.0 if temperature is None else temperature,
                         token_length_normalized if choices_method is None else choices_method)
    if regex is not None:
        re.compile(regex)  # fail at the program line, not inside the server
    if tools is not None:
        from radixlm.lang.tools import check_tools

        tools, tool_choice = check_tools(tools, tool_choice)  # fail at the program line
    if isinstance(json_schema, dict):
        json_schema = json.dumps(json_schema)  # the wire format carries the schema as a JSON string
    return SglGen(name, GenParams.override(
        max_new_tokens=max_tokens, min_new_tokens=min_tokens, n=n, stop=stop, stop_token_ids=stop_token_ids,
        stop_regex=stop_regex, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, ignore_eos=ignore_eos,
        return_logprob=return_logprob, logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs,
        dtype=dtype, regex=regex, json_schema=json_schema, tools=tools, tool_choice=tool_choice))


def _typed_gen(dtype: type, name: str | None, kwargs: dict[str, Any]) -> SglExpr:
    return gen(name, dtype=dtype, **kwargs)


def gen_int(name: str | None = None, max_tokens: int | None = None, n: int | None = None,
            stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
            stop_regex: str | list[str] | None = None, temperature: float | None = None,
            top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
            frequency_penalty: float | None = None, presence_penalty: float | None = None,
            ignore_eos: bool | None = None, return_logprob: bool | None = None,
            logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
            return_text_in_logprobs: bool | None = None) -> SglExpr:
    """`gen` constrained to an integer."""
    kwargs = dict(locals())
    kwargs.pop("name")
    return _typed_gen(int, name, kwargs)


def gen_string(name: str | None = None, max_tokens: int | None = None, n: int | None = None,
               stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
               stop_regex: str | list[str] | None = None, temperature: float | None = None,
               top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
               frequency_penalty: float | None = None, presence_penalty: float | None = None,
               ignore_eos: bool | None = None, return_logprob: bool | None = None,
               logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
               return_text_in_logprobs: bool | None = None) -> SglExpr:
    """`gen` constrained to a double-quoted string."""
    kwargs = dict(locals())
    kwargs.pop("name")
    return _typed_gen(str, name, kwargs)


def select(name: str | None = None, choices: list[str] | None = None, temperature: float = 0.0,
           choices_method: ChoicesSamplingMethod = token_length_normalized) -> SglExpr:
    """Append the choice the model scores best (see radixlm.lang.choices for the methods)."""
    if not choices:
        raise ValueError("select needs a non-empty list of choices")
    return SglSelect(name, choices, temperature, choices_method)


def _role(role: str, expr: SglExpr | str | None) -> SglExprList:
    body = [] if expr is None else [expr]
    return SglExprList([SglRoleBegin(role), *body, SglRoleEnd(role)])


def system(expr: SglExpr | str | None = None) -> SglExprList:
    return _role("system", expr)


def user(expr: SglExpr | str | None = None) -> SglExprList:
    return _role("user", expr)


def assistant(expr: SglExpr | str | None = None) -> SglExprList:
    return _role("assistant", expr)


def system_begin() -> SglRoleBegin:
    return SglRoleBegin("system")


def system_end() -> SglRoleEnd:
    return SglRoleEnd("system")


def user_begin() -> SglRoleBegin:
    return SglRoleBegin("user")


def user_end() -> SglRoleEnd:
    return SglRoleEnd("user")


def assistant_begin() -> SglRoleBegin:
    return SglRoleBegin("assistant")


def assistant_end() -> SglRoleEnd:
    return SglRoleEnd("assistant")


def Runtime(*args: Any, **kwargs: Any):  # noqa: N802 - SGLang's name for a launched server
    """Launch a local server (`python -m radixlm.launch_server`) and connect to it."""
    from radixlm.lang.backend.runtime import Runtime as _Runtime

    return _Runtime(*args, **kwargs)
