"""Grammar-constrained requests in the scheduler: compile off the loop, hold requests until their grammar
is ready, build allowed-token masks, advance matchers, and jump forward over forced text.

Runs in the scheduler process. Compiling happens in the GrammarCache's worker processes (a wall-clock
limit really stops them), so a slow or hostile grammar never blocks the step loop: its request simply
waits here while others run. The cache is created on the first grammar request, so engines that never
constrain anything start no workers.
"""

from __future__ import annotations

import collections
import json
from concurrent.futures import Future

import torch

from radixlm.constrained.bitmask import GrammarMask, MaskBuilder
from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.scheduler.request import Req
from radixlm.sampling_params import SamplingParams

# How many trailing output tokens jump-forward may re-tokenize together with the forced text.
_MAX_RETOKENIZE = 8
_MAX_UNIQUE_GRAMMARS = 64  # schema wrappers kept (each holds its resolved scopes)


def grammar_spec(params: SamplingParams) -> tuple[str, str] | None:
    """(kind, spec) of the request's constraint, or None."""
    if params.regex is not None:
        return "regex", params.regex
    if params.json_schema is not None:
        return "json_schema", params.json_schema
    if params.choices is not None:
        return "choices", json.dumps(params.choices)
    if params.ebnf is not None:
        return "ebnf", params.ebnf
    return None


class GrammarManager:
    def __init__(self, tokenizer, vocab_size: int, config: GrammarConfig):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.config = config
        self._cache = None
        self._pending: list[tuple[Req, Future]] = []
        self._masks = MaskBuilder()  # one reused mask buffer for every step
        self._unique_table = None  # unique_items.TokenTable, built on the first schema that needs it
        self._unique: collections.OrderedDict[str, object] = collections.OrderedDict()  # spec -> grammar

    def _grammar_cache(self):
        if self._cache is None:
            from radixlm.constrained import GrammarOptions, make_backend
            from radixlm.constrained.cache import GrammarCache, GrammarCacheConfig

            options = GrammarOptions(whitespace_pattern=self.config.constrained_json_whitespace_pattern,
                                     jump_forward=not self.config.disable_jump_forward)
            backend = make_backend(self.config.grammar_backend, self.tokenizer, self.vocab_size, options)
            self._cache = GrammarCache(backend, GrammarCacheConfig(
                num_workers=self.config.grammar_num_workers,
                compile_timeout_s=self.config.grammar_compile_timeout))
        return self._cache

    # ---- the grammar queue ------------------------------------------------------------------------
    def submit(self, req: Req) -> None:
        kind, spec = grammar_spec(req.params)
        self._pending.append((req, self._grammar_cache().submit(kind, spec)))

    def num_pending(self) -> int:
        return len(self._pending)

    def poll(self) -> tuple[list[Req], list[tuple[Req, Exception]]]:
        """Requests whose grammar is ready (matcher attached) and those whose grammar failed."""
        ready, failed, still = [], [], []
        for req, fut in self._pending:
            if not fut.done():
                still.append((req, fut))
                continue
            try:
                req.grammar = self._with_unique_items(req, fut.result()).matcher()
                ready.append(req)
            except Exception as exc:  # GrammarError (a 400) or a worker failure
                failed.append((req, exc))
        self._pending = still
        return ready, failed

    def _with_unique_items(self, req: Req, compiled):
        """The compiled grammar, wrapped so that `uniqueItems` on free values is enforced while generating
        (unique_items.py) when the request's schema asks for it. One wrapper per schema text (LRU)."""
        from radixlm.constrained.unique_items import TokenTable, UniqueItemsGrammar, wants_unique_items
        from radixlm.constrained.vocabulary import token_bytes_for

        kind, spec = grammar_spec(req.params)
        if kind != "json_schema" or not wants_unique_items(spec):
            return compiled
        key = f"{id(compiled)}:{spec}"
        if key not in self._unique:
            if self._unique_table is None:
                self._unique_table = TokenTable.build(token_bytes_for(self.tokenizer))
            self._unique[key] = UniqueItemsGrammar(compiled, json.loads(spec), self._unique_table, self.vocab_size)
            while len(self._unique) > _MAX_UNIQUE_GRAMMARS:
                self._unique.popitem(last=False)
        self._unique.move_to_end(key)
        return self._unique[key]

    def remove(self, rid: str) -> Req | None:
        """Take a waiting request out (aborted); a compile only it waited for is stopped."""
        for i, (req, fut) in enumerate(self._pending):
            if req.rid == rid:
                del self._pending[i]
                if self._cache is not None and all(f is not fut for _, f in self._pending):
                    self._cache.abandon(fut)
                return req
        return None

    def drain(self) -> list[Req]:
        """Take every waiting request out (abort all); their compiles are stopped."""
        reqs = [r for r, _ in self._pending]
        if self._cache is not None:
            for _, fut in self._pending:
                self._cache.abandon(fut)
        self._pending = []
        return reqs

    def drain_compile_seconds(self) -> list[float]:
        """Compile times finished since the last call (for the server's grammar compile histogram)."""
        times: list[float] = []
        if self._cache is not None:
            while self._cache.compile_seconds:
                times.append(self._cache.compile_seconds.popleft())
        return times

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
            self._cache = None

    # ---- per step ---------------------------------------------------------------------------------
    def masks(self, reqs: list[Req], width: int, device: torch.device) -> GrammarMask | None:
        """The sampling batch's grammar masks (row i = reqs[i], logits `width` wide), or None if no
        request is constrained. Valid until the next call (the buffer is reused)."""
        return self._masks.build([req.grammar for req in reqs], width, device)

    def jump_forward(self, req: Req) -> tuple[int, list[int]] | None:
        """After the matcher accepted the latest token: (tokens to drop, tokens to append), already applied
        to the matcher, or None. Only tokens whose K/V the request owns may be dropped (a dropped token's
        slot is freed), so the re-tokenized tail never reaches into shared radix-tree slots."""
        if self.config.disable_jump_forward or req.logprob.return_logprob:
            return None  # forced tokens have no sampled logprobs: keep logprob lists aligned
        from radixlm.constrained.jump_forward import apply_jump_forward

        owned = req.kv_len - req.tree_len + 1  # +1: the token just sampled has no K/V yet
        max_back = max(0, min(_MAX_RETOKENIZE, owned, len(req.output_ids)))
        return apply_jump_forward(req.grammar, self.tokenizer, req.output_ids, max_back)
