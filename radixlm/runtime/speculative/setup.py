"""Build the speculative-decoding controller from the engine config (called by runtime/builder.py)."""

from __future__ import annotations

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.speculative.controller import NgramProposer, SpecController


def build_speculation(config: EngineConfig, runner, context_len: int, tokenizer=None) -> SpecController:
    """tokenizer: NGRAM's text lookup (speculative/text_lookup.py); None turns it off."""
    spec = config.speculative
    if spec.algorithm == "NGRAM":
        return SpecController(spec, NgramProposer(spec, tokenizer), context_len)
    if spec.algorithm == "STANDALONE":
        from radixlm.runtime.speculative.draft_model import DraftModelProposer

        return SpecController(spec, DraftModelProposer(config, runner), context_len)
    raise ValueError(f"unknown speculative_algorithm {spec.speculative_algorithm!r}")
