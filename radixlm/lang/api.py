"""Public primitives of the frontend language, with SGLang's names and parameters.

Runs in the user's process. `import radixlm as sgl` makes an SGLang program run unchanged.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable

from radixlm.lang.choices import ChoicesSamplingMethod, token_length_normalized
from radixlm.lang.global_config import global_config
from radixlm.lang.ir import SglExpr, SglExprList, SglGen, SglRoleBegin, SglRoleEnd, SglSelect
from radixlm.lang.params import FRONTEND_FIELDS, SAMPLING_FIELDS, GenParams
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


def gen(name: str | None = None, max_tokens: int | None = None, *, choices: list[str] | None = None,
        choices_method: ChoicesSamplingMethod | None = None, **params: Any) -> SglExpr:
    """Generate into variable `name`. Unset parameters inherit the run() defaults.

    `params`: any SamplingParams field by its name (radixlm/sampling_params.py), SGLang's `min_tokens`,
    and the frontend's logprob fields and `dtype` (lang/params.py); `inspect.signature(gen)` lists them.
    With `choices`, this is `select`. `dtype` (int, float, str, bool) constrains the output to that
    type; `regex` / `json_schema` (a JSON string or a dict) constrain it to a grammar. `tools` (OpenAI tool
    dicts) and `tool_choice` make calls possible: meta_info["tool_calls"] lists them with arguments as dicts.
    """
    if choices:
        temperature = params.get("temperature")
        return SglSelect(name, choices, 0.0 if temperature is None else temperature,
                         token_length_normalized if choices_method is None else choices_method)
    return SglGen(name, GenParams.from_options({"max_tokens": max_tokens, **params}))


def gen_int(name: str | None = None, max_tokens: int | None = None, **params: Any) -> SglExpr:
    """`gen` constrained to an integer."""
    return gen(name, max_tokens, dtype=int, **params)


def gen_string(name: str | None = None, max_tokens: int | None = None, **params: Any) -> SglExpr:
    """`gen` constrained to a double-quoted string."""
    return gen(name, max_tokens, dtype=str, **params)


def _keyword_signature(func: Callable[..., Any], names: Iterable[str]) -> inspect.Signature:
    """func's signature with its **params spelled out as the keyword options it takes (for help())."""
    head = [p for p in inspect.signature(func).parameters.values() if p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in head}
    extra = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in names if n not in taken]
    return inspect.signature(func).replace(parameters=[*head, *extra])


_GEN_KEYWORDS = ("min_tokens", *SAMPLING_FIELDS, *FRONTEND_FIELDS)
gen.__signature__ = _keyword_signature(gen, _GEN_KEYWORDS)  # type: ignore[attr-defined]
gen_int.__signature__ = _keyword_signature(gen_int, [n for n in _GEN_KEYWORDS if n != "dtype"])  # type: ignore[attr-defined]
gen_string.__signature__ = _keyword_signature(gen_string, [n for n in _GEN_KEYWORDS if n != "dtype"])  # type: ignore[attr-defined]


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
