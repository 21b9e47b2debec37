"""Intermediate representation of a frontend program: sampling overrides and expression nodes.

Runs in the user's process. A program appends expressions to its state (`s += gen("x")`); the
interpreter executes them in order. Nodes are plain values: the interpreter never mutates them, so
one node (e.g. a module-level `gen`) may be appended to many states.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixlm.lang.choices import ChoicesSamplingMethod

# The regexes SGLang's frontend uses for `dtype=`; kept identical so programs behave the same.
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

_DTYPE_REGEX: dict[str, tuple[str, bool]] = {
    # name -> (regex, whether whitespace ends the value)
    "int": (REGEX_INT, True),
    "float": (REGEX_FLOAT, True),
    "str": (REGEX_STR, False),
    "bool": (REGEX_BOOL, False),
}

# Fields a `gen` may override; `None` means "inherit the run() default".
OVERRIDABLE = (
    "max_new_tokens", "min_new_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature",
    "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos", "return_logprob",
    "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "dtype", "regex", "json_schema",
    "tools", "tool_choice",
)


@dataclass(frozen=True)
class GenParams:
    """Sampling parameters of one `gen`, as the frontend sees them (SGLang's SglSamplingParams).

    As an override (inside `gen`) every field is optional; `run()` builds the defaults and the
    interpreter merges the two with `merged_with`.
    """

    max_new_tokens: int | None = 128
    min_new_tokens: int | None = 0
    n: int | None = 1
    stop: str | list[str] | tuple[str, ...] | None = ()
    stop_token_ids: list[int] | tuple[int, ...] | None = ()
    stop_regex: str | list[str] | tuple[str, ...] | None = ()
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    top_k: int | None = -1
    min_p: float | None = 0.0
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    ignore_eos: bool | None = False
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    dtype: type | str | None = None
    regex: str | None = None
    json_schema: str | None = None
    tools: tuple[dict[str, Any], ...] | None = None  # OpenAI tool dicts (lang/tools.py)
    tool_choice: Any = None

    @classmethod
    def override(cls, **values: Any) -> "GenParams":
        """An override object: every field not given is None (inherit)."""
        blank = {f.name: None for f in dataclasses.fields(cls)}
        blank.update(values)
        return cls(**blank)

    def merged_with(self, override: "GenParams", extra_stop: tuple[str, ...] = ()) -> "GenParams":
        """These defaults with every non-None field of `override` applied, plus template stop strings."""
        changes = {name: getattr(override, name) for name in OVERRIDABLE if getattr(override, name) is not None}
        merged = dataclasses.replace(self, **changes)
        if extra_stop:
            merged = dataclasses.replace(merged, stop=[*stop_list(merged.stop), *extra_stop])
        return merged

    def with_dtype_applied(self) -> "GenParams":
        """Turn `dtype` into the regex (and stop strings) that constrain generation to that type."""
        if self.dtype is None:
            return self
        name = self.dtype if isinstance(self.dtype, str) else getattr(self.dtype, "__name__", "")
        if name not in _DTYPE_REGEX:
            raise ValueError(f"dtype: unsupported dtype {self.dtype!r}; use int, float, str or bool")
        regex, ends_on_space = _DTYPE_REGEX[name]
        stop = stop_list(self.stop) + ([" ", "\n"] if ends_on_space else [])
        return dataclasses.replace(self, regex=regex, stop=stop, dtype=None)

    def to_native_sampling_params(self) -> dict[str, Any]:
        """The `sampling_params` object of a native /generate request (SGLang's to_srt_kwargs)."""
        return {
            "skip_special_tokens": True,
            "spaces_between_special_tokens": True,
            "max_new_tokens": self.max_new_tokens,
            "min_new_tokens": self.min_new_tokens,
            "n": self.n,
            "stop": stop_list(self.stop),
            "stop_token_ids": list(self.stop_token_ids or ()),
            "stop_regex": stop_list(self.stop_regex),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "ignore_eos": self.ignore_eos,
            "regex": self.regex,
            "json_schema": self.json_schema,
            **self._tool_params(),
        }

    def _tool_params(self) -> dict[str, Any]:
        if not self.tools:
            return {}
        from radixlm.lang.tools import tool_grammar

        grammar = tool_grammar(self.tools, self.tool_choice)
        return {} if grammar is None else {"ebnf": grammar}

    def logprob_fields(self) -> dict[str, Any]:
        """Top-level logprob fields of a native request; only those the program set."""
        names = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def stop_list(stop: str | list[str] | tuple[str, ...] | None) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    return list(stop)


# ---- expression nodes ---------------------------------------------------------------------------
class SglExpr:
    """Base of every node; `+` builds an expression list so `"Q: " + gen("a")` works."""

    def __add__(self, other: "SglExpr | str") -> "SglExprList":
        return _concat(self, _as_expr(other))

    def __radd__(self, other: "SglExpr | str") -> "SglExprList":
        return _concat(_as_expr(other), self)


def _as_expr(value: "SglExpr | str") -> SglExpr:
    if isinstance(value, str):
        return SglConstantText(value)
    if not isinstance(value, SglExpr):
        raise TypeError(f"cannot append {type(value).__name__} to a program; use a str or an expression")
    return value


def _concat(a: SglExpr, b: SglExpr) -> "SglExprList":
    left = a.expr_list if isinstance(a, SglExprList) else [a]
    right = b.expr_list if isinstance(b, SglExprList) else [b]
    return SglExprList([*left, *right])


class SglExprList(SglExpr):
    def __init__(self, expr_list: list[SglExpr | str]):
        self.expr_list = list(expr_list)

    def __repr__(self) -> str:
        return f"ExprList({self.expr_list})"


class SglConstantText(SglExpr):
    def __init__(self, value: str):
        self.value = value

    def __repr__(self) -> str:
        return f"Constant({self.value!r})"


class SglGen(SglExpr):
    def __init__(self, name: str | None, params: GenParams):
        self.name = name
        self.sampling_params = params

    def __repr__(self) -> str:
        return f"Gen({self.name!r})"


class SglSelect(SglExpr):
    def __init__(self, name: str | None, choices: list[str], temperature: float,
                 choices_method: "ChoicesSamplingMethod"):
        self.name = name
        self.choices = list(choices)
        self.temperature = temperature
        self.choices_method = choices_method

    def __repr__(self) -> str:
        return f"Select({self.name!r}, choices={self.choices})"


class SglRoleBegin(SglExpr):
    def __init__(self, role: str):
        self.role = role

    def __repr__(self) -> str:
        return f"RoleBegin({self.role})"


class SglRoleEnd(SglExpr):
    def __init__(self, role: str):
        self.role = role

    def __repr__(self) -> str:
        return f"RoleEnd({self.role})"


class SglVarScopeBegin(SglExpr):
    def __init__(self, name: str):
        self.name = name


class SglVarScopeEnd(SglExpr):
    def __init__(self, name: str):
        self.name = name


class SglCommitLazy(SglExpr):
    """Send the text so far to the backend with max_new_tokens 0, so forks start from a cached prefix."""


class SglConcateAndAppend(SglExpr):
    def __init__(self, states: list[Any]):
        self.states = states


class SglArgument(SglExpr):
    """Placeholder for a program argument while tracing; using its value stops the trace."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"Argument({self.name})"

    def __str__(self) -> str:
        from radixlm.lang.tracer import StopTracing

        raise StopTracing(self.name)

    def __format__(self, spec: str) -> str:
        return str(self)


def variable_names(expr: SglExpr | str) -> list[str]:
    """Names this expression will set, so readers can wait for them before it runs."""
    if isinstance(expr, (SglGen, SglSelect, SglVarScopeBegin)) and expr.name is not None:
        return [expr.name]
    if isinstance(expr, SglExprList):
        return [name for sub in expr.expr_list for name in variable_names(sub)]
    return []
