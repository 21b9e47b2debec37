"""JSON Schema lowering: a real-world schema -> a self-contained schema one grammar library compiles.

Runs in compile workers (and in any process for tests/tools). First version: the interface other
backends build against; the lowering itself grows behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixlm.constrained.base import GrammarOptions

TARGETS = ("outlines", "xgrammar", "llguidance")


@dataclass(frozen=True)
class LoweredSchema:
    """`schema` is self-contained (no external refs) and uses only what `target` compiles exactly;
    `approximations` lists "keyword at path" for each constraint the grammar does not enforce exactly
    (the finished output must still be validated against the original schema)."""

    schema: dict[str, Any]
    approximations: tuple[str, ...]


def lower_schema(spec: str, options: GrammarOptions, target: str) -> LoweredSchema:
    """Lower a json_schema spec for `target` ("outlines" | "xgrammar" | "llguidance"), or GrammarError."""
    from radixlm.constrained.json_schema import load_schema

    if target not in TARGETS:
        raise ValueError(f"unknown lowering target {target!r}; known: {TARGETS}")
    return LoweredSchema(load_schema(spec, options), ())
