"""Build the speculative-decoding controller from the engine config (called by runtime/builder.py)."""

from __future__ import annotations

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.speculative.controller import NgramProposer, SpecController
from radixlm.runtime.speculative.stop_cut import StopCut
from radixlm.runtime.speculative.text_lookup import TokenText


def build_speculation(config: EngineConfig, runner, context_len: int, tokenizer=None,
                      eos_token_ids: frozenset[int] = frozenset()) -> SpecController:
    """tokenizer: NGRAM's text lookup (speculative/text_lookup.py) and the drafts' cut at stop strings
    (stop_cut.py); None turns both off."""
    spec = config.speculative
    stop_cut = StopCut(eos_token_ids, TokenText(tokenizer) if tokenizer is not None else None)
    if spec.algorithm == "NGRAM":
        return SpecController(spec, NgramProposer(spec, tokenizer), context_len, stop_cut)
    if spec.algorithm == "STANDALONE":
        from radixlm.runtime.speculative.draft_model import DraftModelProposer

        return SpecController(spec, DraftModelProposer(config, runner), context_len, stop_cut)
    raise ValueError(f"unknown speculative_algorithm {spec.speculative_algorithm!r}")
