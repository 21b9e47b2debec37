"""Intermediate representation of a frontend program: expression nodes.

Runs in the user's process. A program appends expressions to its state (`s += gen("x")`); the
interpreter executes them in order. Nodes are plain values: the interpreter never mutates them, so
one node (e.g. a module-level `gen`) may be appended to many states. Sampling options: lang/params.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixlm.lang.params import GenParams

if TYPE_CHECKING:
    from radixlm.lang.choices import ChoicesSamplingMethod


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
