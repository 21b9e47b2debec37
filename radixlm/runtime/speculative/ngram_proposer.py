"""NgramProposer: NGRAM drafts for SpecController, from the request's own text, the other running requests'
text, the corpus of finished ones, and a character-level lookup for copies that tokenize
differently.

Runs in the scheduler process. The tables are in ngram.py (NgramIndex, LiveNgrams, NgramCorpus), the
character lookup in text_lookup.py, where copies end in copy_breaks.py and the cursor into another
request's text in follow.py; this class decides which of them proposes, and how much of a draft is
kept.

Why its rules (their numbers are in tuning.py):
  - A copying request accepts a 1-token match in its own tokens (right after a copied value starts
    only its last token matches the source) and, where its token suffix occurs nowhere earlier, a
    lookup of its last characters (a copied value that starts after a quote is tokenized
    differently). A request that is not copying needs a longer match in a large step, where short
    matches' verify tokens cost compute; not in its own text once it has had drafts accepted (a JSON
    row that invented part of a value copies its record again a little later).
  - Own-text drafts (a record's value, a function's lines) are accepted far less often than drafts
    from another request's text or the corpus: a copied value ends where its source goes on, and a
    short character match is often the wrong occurrence. In a large step, where a draft token costs
    about half of what an accepted one saves, a request whose own-text acceptance average is below
    own_weak_acceptance keeps at most own_weak_max_draft of them (Draft.keep; a PADDED step verifies
    them whole); a request starts just below that bar, so one draft accepted whole lifts the cap.
    Its draft also stops where other earlier occurrences of its last own_agree_context tokens
    continue otherwise (the text is ambiguous there): only in large steps, since at one row the
    tokens cut are those a lucky guess would have had accepted. At any batch, own-text drafts stop
    where its copies have ended more often than gone on (copy_breaks.py).
  - A new request whose first adopt_min+ tokens a running (or recently finished) request's index
    holds (a batch's shared system prompt, a conversation's next turn) starts from a copy of that
    index (NgramIndex.adopt): indexing a long cached prompt token by token would hold up a short
    prefill step.
"""

from __future__ import annotations

from collections import OrderedDict

from radixlm.runtime.config import SpeculativeConfig
from radixlm.runtime.scheduler.request import Req
from radixlm.runtime.speculative.copy_breaks import CopyBreaks, Signatures
from radixlm.runtime.speculative.drafts import Draft
from radixlm.runtime.speculative.follow import Follow
from radixlm.runtime.speculative.ngram import (LiveNgrams, NgramCorpus, NgramIndex, Proposal, common_prefix,
                                               propose_ngram)
from radixlm.runtime.speculative.text_lookup import TextIndex, TokenText
from radixlm.runtime.speculative.tuning import TUNING as T


class NgramProposer:
    cheap = True

    def __init__(self, config: SpeculativeConfig, tokenizer=None):
        self.min_n, self.max_n = config.speculative_ngram_min_match, config.speculative_ngram_max_match
        self.short_n = min(self.min_n, T.copying_min_match)
        self.corpus = NgramCorpus(self.min_n, self.max_n, config.max_draft)
        self.live = LiveNgrams()
        self._own: dict[str, NgramIndex] = {}
        self.text_of = TokenText(tokenizer) if tokenizer is not None else None  # None: no text lookup
        self._text: dict[str, TextIndex] = {}
        self._cursors: dict[str, list[int]] = {}  # rid -> positions after its latest accepted copies
        self._source: dict[str, tuple[int, list[int]]] = {}  # rid -> this step's own-text draft, where it starts
        self._signatures = Signatures(self.text_of)
        self._breaks: dict[str, CopyBreaks] = {}  # rid -> where its copies end (learned from its prompt first)
        self._own_acceptance: dict[str, float] = {}  # rid -> its own-text drafts' acceptance average
        self.own_prior = T.own_prior  # the average before a request's first own-text draft is verified
        self.follow = Follow()  # where each request copies another running request's text (follow.py)
        self._donors: OrderedDict[int, tuple[str, NgramIndex]] = OrderedDict()  # finished indexes, oldest first
        self._donor_tokens = 0

    def _index(self, req: Req) -> NgramIndex:
        own = self._own.get(req.rid)
        if own is None:
            own = self._own[req.rid] = NgramIndex(self.short_n, self.max_n, self.live.table(req.namespace),
                                                  self.min_n)
            own.append_only = req.grammar is None  # jump-forward replaces a constrained request's tokens
            seq = req.full_ids()
            donor = self._donor(own, seq, req.namespace)
            if donor is not None:
                own.adopt(donor, seq)
        return own

    def _donor(self, own: NgramIndex, seq: list[int], namespace: str) -> NgramIndex | None:
        """A running request's index (same namespace) or a kept finished one that begins with tuning.adopt_min+ of
        seq's tokens and goes on past them for less than that (its text after the common prefix is taken
        back out one n-gram at a time); the one sharing the most, or None."""
        best, best_len = None, T.adopt_min - 1
        head = seq[: T.adopt_min]
        running = [o for o in self._own.values() if o is not own and o.append_only and o.shared is own.shared]
        for other in running + [index for ns, index in reversed(self._donors.values()) if ns == namespace]:
            if other.tokens[: T.adopt_min] != head or other.tokens[: best_len + 1] != seq[: best_len + 1]:
                continue  # cannot share more than the best so far (one comparison, not a search)
            limit = min(len(seq), other.indexed)
            same = common_prefix(seq, other.tokens, limit)
            if same > best_len and other.indexed - same < same:
                best, best_len = other, same
                if same == limit >= other.indexed - 1:  # all of it, nothing to take back out: none is better
                    break
        if best is not None and id(best) in self._donors:
            self._donors.move_to_end(id(best))  # used: the last to go
        return best

    def _keep_donor(self, namespace: str, index: NgramIndex) -> None:
        index.shared = None  # finished: it writes no more (and holds no namespace's live table)
        self._donors[id(index)] = (namespace, index)
        self._donor_tokens += index.indexed
        while self._donor_tokens > T.donor_tokens:
            _, (_, old) = self._donors.popitem(last=False)
            self._donor_tokens -= old.indexed

    def observe(self, reqs: list[Req]) -> None:
        """Index the new tokens, and build what a lookup may need next, where a GPU hides the work (the
        scheduler calls this after a launch): where its copies end (learned from its prompt once) and, for a
        copying request (drafts accepted), the text of its sequence for a text lookup."""
        for req in reqs:  # incremental: only tokens added since the last step are indexed
            seq = req.full_ids()
            self._index(req).observe(seq)
            self._copy_breaks(req)
            if req.num_spec_accepted > 0 and self.text_of is not None:
                self._text_index(req).observe(seq)

    def propose(self, reqs: list[Req], ks: list[int], copying: list[bool], large_batch: bool = False
                ) -> list[Draft]:
        weak = min(self.min_n + T.large_batch_extra_match * large_batch, self.max_n)  # for a request not copying
        self._source.clear()
        self.follow.new_step()
        return [self._draft(req, k, copy, weak, large_batch) for req, k, copy in zip(reqs, ks, copying)]

    def _draft(self, req: Req, k: int, copy: bool, weak: int, large_batch: bool) -> Draft:
        seq = req.full_ids()  # one copy of the prompt + output for the lookups and the cuts below
        p = self._propose(req, seq, k, self.short_n if copy else weak, copy)
        if not p.tokens and not copy and weak > self.min_n and req.num_spec_accepted > 0:
            own = self._propose_one(req, seq, k, self.min_n, False)  # its own text at the usual match length
            p = own if own.source is not None else p
        if p.shared is not None:
            self.follow.drafted(req.rid, p.shared, req.seq_len())
        if p.source is None:
            return Draft(p.tokens, p.match, None, len(p.tokens))
        tokens, keep = self._own_cuts(req, seq, p.source, p.tokens, large_batch)
        self._source[req.rid] = (p.source, tokens)
        return Draft(tokens, p.match, None, keep)

    def _own_cuts(self, req: Req, seq: list[int], source: int, tokens: list[int], large_batch: bool
                  ) -> tuple[list[int], int]:
        """An own-text draft cut where its copies end (copy_breaks.py), and how many of its tokens a large
        step keeps where each costs a token's compute (the weak cap and the agreement cut, then the same)."""
        breaks = self._copy_breaks(req)
        if not large_batch:
            tokens = tokens[: breaks.keep(seq, source, tokens)]
            return tokens, len(tokens)
        cut = tokens
        if self._own_acceptance.get(req.rid, self.own_prior) < T.own_weak_acceptance:
            cut = cut[: T.own_weak_max_draft]
        cut = cut[: max(self._index(req).agreed(seq, cut, source, T.own_agree_context), T.own_agree_min)]
        keep = breaks.keep(seq, source, cut)
        return tokens[: breaks.keep(seq, source, tokens) if len(cut) < len(tokens) else keep], keep

    def _copy_breaks(self, req: Req) -> CopyBreaks:
        breaks = self._breaks.get(req.rid)
        if breaks is None:  # learned once, at the request's first observe (or first own-text proposal)
            breaks = self._breaks[req.rid] = CopyBreaks(self._signatures)
            breaks.learn_prompt(req.input_ids)
        return breaks

    def _propose(self, req: Req, seq: list[int], k: int, min_n: int, copying: bool) -> Proposal:
        """The continuation of the source req is following (follow.py) where it agrees with req for longer
        than any lookup matches (at least min_n tokens), else the lookups' proposal."""
        followed = self.follow.propose(req.rid, seq, k)
        if followed.tokens and followed.match >= max(min_n, self.max_n):
            return followed
        p = self._propose_one(req, seq, k, min_n, copying)
        return followed if followed.tokens and followed.match >= max(min_n, p.match) else p

    def _propose_one(self, req: Req, seq: list[int], k: int, min_n: int, copying: bool) -> Proposal:
        cursors = self._cursors.get(req.rid, ())
        p = propose_ngram(seq, self._index(req), self.corpus, req.namespace, k, self.live, min_n, cursors)
        if p.tokens or not copying or self.text_of is None:
            return p
        return self._text_index(req).propose(seq, k, T.text_min_chars, cursors)

    def _text_index(self, req: Req) -> TextIndex:
        text = self._text.get(req.rid)
        if text is None:
            text = self._text[req.rid] = TextIndex(self.text_of)
        return text

    def on_verified(self, req: Req, proposed: int, accepted: int) -> None:
        self.follow.verified(req.rid, accepted)
        drafted = self._source.pop(req.rid, None)
        if drafted is None:
            return
        source, draft = drafted
        self._breaks[req.rid].record(req.full_ids(), source, draft, proposed, accepted)
        if proposed:
            old = self._own_acceptance.get(req.rid, self.own_prior)
            self._own_acceptance[req.rid] = (1 - T.own_ema_weight) * old + T.own_ema_weight * accepted / proposed
        if accepted > 0:  # the copy continues after what was accepted
            cursors = self._cursors.setdefault(req.rid, [])
            if source + accepted in cursors:
                cursors.remove(source + accepted)
            cursors.insert(0, source + accepted)
            del cursors[T.cursors :]

    def on_finish(self, req: Req) -> None:
        for table in (self._text, self._cursors, self._source, self._own_acceptance, self._breaks):
            table.pop(req.rid, None)
        self.follow.finish(req.rid)
        own = self._own.pop(req.rid, None)
        if own is not None:
            self.live.remove(req.namespace, own)
        if req.finish is not None and req.finish.type != "abort":
            self.corpus.add(req.namespace, req.full_ids())
            if own is not None and own.append_only:
                self._keep_donor(req.namespace, own)

    def flush(self) -> None:
        self.corpus.clear()
        self._donors.clear()
        self._donor_tokens = 0

    def check_integrity(self, idle: bool) -> None:
        assert not idle or not self._own, "n-gram indexes left while idle"
        assert not idle or not (self._text or self._cursors or self._source or self._own_acceptance
                                or self._breaks), "text indexes / cursors / own-text state left while idle"
        assert not idle or not len(self.live), "live n-gram tables left while idle"
        assert not idle or not len(self.follow), "cursors into other requests' text left while idle"
        assert self._donor_tokens == sum(index.indexed for _, index in self._donors.values()) <= T.donor_tokens
        assert all(index.append_only and index.shared is None for _, index in self._donors.values())
