"""How `select` turns per-choice token logprobs into a decision (SGLang's choices methods).

Runs in the user's process. Every backend computes, for each choice, the logprobs of the tokens that
spell the choice after the prompt (`input_token_logprobs`, entries `[logprob, token_id, text]`) and
their mean (`normalized_prompt_logprobs`); a method picks the winner from those.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

Entry = list[Any]  # [logprob | None, token_id, text | None]


@dataclass(frozen=True)
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


def _argmax_first(values: list[float]) -> int:
    # Ties go to the earliest choice, so results do not depend on float noise ordering.
    return max(range(len(values)), key=values.__getitem__)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def normalized_logprob(entries: list[Entry]) -> float:
    """Mean logprob of the choice's tokens; entries without a logprob (the very first prompt token) are skipped."""
    values = [e[0] for e in entries if e[0] is not None]
    return sum(values) / len(values) if values else 0.0


class ChoicesSamplingMethod(ABC):
    """Picks one choice from the scored choices."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return False

    @abstractmethod
    def __call__(self, *, choices: list[str], normalized_prompt_logprobs: list[float],
                 input_token_logprobs: list[list[Entry]], output_token_logprobs: list[list[Entry]],
                 unconditional_token_logprobs: list[list[Entry]] | None = None) -> ChoicesDecision:
        ...

    def __repr__(self) -> str:
        return type(self).__name__


def _base_meta(normalized: list[float], inputs: list[list[Entry]], outputs: list[list[Entry]]) -> dict[str, Any]:
    return {"normalized_prompt_logprobs": normalized, "input_token_logprobs": inputs,
            "output_token_logprobs": outputs}


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean token logprob (the default)."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        best = choices[_argmax_first(normalized_prompt_logprobs)]
        return ChoicesDecision(best, _base_meta(normalized_prompt_logprobs, input_token_logprobs,
                                                output_token_logprobs))


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Compare choices token by token, keeping those with the best logprob at each position.

    A choice shorter than the longest is padded with its own mean logprob, so a prefix of a longer
    choice competes fairly past its end.
    """

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        matrix = self._logprob_matrix(input_token_logprobs)
        width = len(matrix[0]) if matrix else 0
        remaining = list(range(len(choices)))
        for j in range(width):
            best = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == best]
            if len(remaining) == 1:
                break
        meta = _base_meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs)
        meta["greedy_logprob_matrix"] = matrix
        return ChoicesDecision(choices[remaining[0]], meta)

    @staticmethod
    def _logprob_matrix(inputs: list[list[Entry]]) -> list[list[float]]:
        width = max((len(option) for option in inputs), default=0)
        rows = []
        for option in inputs:
            values = [e[0] if e[0] is not None else 0.0 for e in option]
            pad = _mean(values)
            rows.append(values + [pad] * (width - len(values)))
        return rows


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """Mean of (conditional - unconditional) token logprob: corrects for choices that are likely anyway."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional token logprobs are required for unconditional_likelihood_normalized")
        scores = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs):
            if len(cond) != len(uncond):
                raise ValueError("conditional and unconditional token logprobs must have the same length")
            # The first unconditional token has no context, hence no logprob: count it as 0.
            diffs = [(c[0] or 0.0) - (u[0] or 0.0) for c, u in zip(cond, uncond)]
            scores.append(float(_mean(diffs)) if diffs else -math.inf)
        meta = _base_meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs)
        meta["unconditional_token_logprobs"] = unconditional_token_logprobs
        meta["normalized_unconditional_prompt_logprobs"] = scores
        return ChoicesDecision(choices[_argmax_first(scores)], meta)


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
