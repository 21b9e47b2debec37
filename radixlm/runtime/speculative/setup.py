"""Build the speculative-decoding controller from the engine config (called by runtime/builder.py)."""

from __future__ import annotations

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.speculative.controller import SpecController
from radixlm.runtime.speculative.ngram_proposer import NgramProposer
from radixlm.runtime.speculative.stop_cut import StopCut
from radixlm.runtime.speculative.text_lookup import TokenText


def build_speculation(config: EngineConfig, runner, context_len: int, tokenizer=None,
                      eos_token_ids: frozenset[int] = frozenset()) -> SpecController:
    """tokenizer: NGRAM's text lookup (speculative/text_lookup.py) and the drafts' cut at stop strings
    (stop_cut.py); None turns both off."""
    spec = config.speculative
    if spec.algorithm == "NGRAM":
        proposer = NgramProposer(spec, tokenizer)
        text_of = proposer.text_of  # one cache of token texts for the text lookup and the stop cut
    elif spec.algorithm == "STANDALONE":
        from radixlm.runtime.speculative.draft_model import DraftModelProposer

        proposer = DraftModelProposer(config, runner)
        text_of = TokenText(tokenizer) if tokenizer is not None else None
    else:
        raise ValueError(f"unknown speculative_algorithm {spec.speculative_algorithm!r}")
    one_call = getattr(getattr(runner, "model", None), "decode_stack", None) is not None
    graphs = getattr(runner, "verify_graphs", None)  # captured before this is built (builder.py)
    padded = graphs.max_bs if graphs is not None else 0
    return SpecController(spec, proposer, context_len, StopCut(eos_token_ids, text_of), one_call, padded)
