"""OutputProcessor: which logits a step needs, then sampling, logprobs and finish checks.

Runs in the scheduler process. Logprob semantics follow wire-protocol.md: input logprobs cover prompt
positions [logprob_start_len, prompt_len), the first entry's logprob is null, and the logprob of token p
comes from the logits at position p - 1. All logprobs are log_softmax of the raw model logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from radixlm.constrained.bitmask import GrammarMask
from radixlm.runtime.forward import ForwardBatch
from radixlm.runtime.incremental_detok import IncrementalDecoder, find_stop, find_stop_regex
from radixlm.runtime.messages import TokenOut
from radixlm.runtime.sampling import logprobs as lp
from radixlm.runtime.sampling.pooling import pool_last_token
from radixlm.runtime.sampling.sampler import SampleOutput, Sampler, SamplingRow
from radixlm.runtime.scheduler import prompt_logprobs
from radixlm.runtime.scheduler.grammar import GrammarManager
from radixlm.runtime.scheduler.request import FinishReason, Req
from radixlm.runtime.speculative.verify import verify_sampled


@dataclass
class LogitsPlan:
    indices: torch.Tensor  # int64 [N]: token positions of the batch whose logits are computed
    sample: list[tuple[int, int]] = field(default_factory=list)  # (row index, logits row)
    # (row index, first prompt position p, number of positions): logits rows for input logprobs
    prompt: list[tuple[int, int, int, int]] = field(default_factory=list)  # (row, p0, count, logits row0)
    # The sampled rows' grammar masks, built BEFORE the forward: the matchers' states are known then, the
    # caches still hold them (after a forward on the CPU the same build measured several times slower),
    # and on a GPU the build overlaps the queued forward. Built vocab_size wide: the sampler works on
    # that many columns at most (and cuts a mask to narrower logits).
    masks: GrammarMask | None = None
    # Speculative verify rows: (row index, first logits row); logits at each of the row's 1 + k positions.
    verify: list[tuple[int, int]] = field(default_factory=list)
    # Every logits row is a sample row whose token is the plain argmax of its raw logits (greedy, no
    # processor, no logprobs): the model may then leave out logits that cannot be the argmax.
    argmax_only: bool = False
    # Embedding rows: (row index, logits row) at the request's last prompt token, pooled from the hidden state.
    embed: list[tuple[int, int]] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: frozenset[int], context_len: int,
                 grammar: GrammarManager, truncate_kv: Callable[[Req, int], None]):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.context_len = context_len
        self.sampler = Sampler(vocab_size, eos_token_ids)
        self.grammar = grammar
        self._truncate_kv = truncate_kv  # jump-forward drops re-tokenized tokens' K/V
        self._stop_decoders: dict[str, IncrementalDecoder] = {}
        self.spec = None  # speculative.controller.SpecController when speculative decoding is on

    # ---- before the forward -----------------------------------------------------------------------
    def plan_logits(self, batch: ForwardBatch) -> LogitsPlan:
        indices: list[int] = []
        plan = LogitsPlan(torch.empty(0))
        for i, row in enumerate(batch.rows):
            req = row.req
            if req.wants_input_logprobs() and not req.input_logprobs_done:
                # Positions p in [start, L - 2] predict prompt tokens p + 1 (L - 1 predicts the output).
                lo = max(row.start, req.logprob_start())
                hi = min(row.end, len(req.input_ids) - 1)
                if hi > lo:
                    plan.prompt.append((i, lo, hi - lo, len(indices)))
                    indices.extend(batch.token_index(i, p) for p in range(lo, hi))
            if row.draft:
                plan.verify.append((i, len(indices)))
                indices.extend(batch.token_index(i, p) for p in range(row.end - len(row.draft) - 1, row.end))
            elif row.end == req.seq_len() and len(req.output_ids) < req.max_new_tokens:
                plan.sample.append((i, len(indices)))
                indices.append(batch.token_index(i, row.end - 1))
            elif req.embed and row.end == req.seq_len():  # the last chunk carries the last token
                plan.embed.append((i, len(indices)))
                indices.append(batch.token_index(i, row.end - 1))
        plan.indices = torch.tensor(indices, dtype=torch.int64)
        # A greedy verify row reads only the argmax at each of its positions (_verify), as a decode row does.
        plan.argmax_only = (bool(plan.sample or plan.verify) and not plan.prompt
                            and all(_argmax_only(batch.rows[i].req) for i, _ in plan.sample + plan.verify))
        if plan.sample:
            plan.masks = self.grammar.masks([batch.rows[i].req for i, _ in plan.sample], self.sampler.vocab_size,
                                            batch.input_ids.device)
        return plan

    # ---- after the forward ------------------------------------------------------------------------
    def pool(self, batch: ForwardBatch, plan: LogitsPlan, hidden: torch.Tensor) -> None:
        """Embedding rows: each request's vector from the hidden states at plan.indices (it then finishes
        in process(), as every max_new_tokens == 0 request does)."""
        vectors = pool_last_token(hidden[[r for _, r in plan.embed]])
        for (i, _), vector in zip(plan.embed, vectors):
            batch.rows[i].req.embedding = vector

    def process(self, batch: ForwardBatch, plan: LogitsPlan, logits: torch.Tensor) -> tuple[list[TokenOut], list[Req]]:
        for i, p0, count, r0 in plan.prompt:
            self._prompt_logprobs(batch.rows[i].req, p0, logits[r0 : r0 + count])
        new_tokens: dict[int, tuple[list[int], int]] = {}  # row -> (new ids, rollback)
        argmax = self._argmax_all(batch, plan, logits) if plan.argmax_only and plan.verify else None
        if plan.sample:
            reqs = [batch.rows[i].req for i, _ in plan.sample]
            picked = [r for _, r in plan.sample]
            if argmax is not None:  # no request wants logprobs (argmax_only)
                sampled = SampleOutput([argmax[r] for r in picked], [None] * len(picked))
            else:
                # Every row, in order (a decode batch): the logits as they are, not a copy.
                rows_logits = logits if picked == list(range(logits.shape[0])) else logits[picked]
                sampled = self.sampler(rows_logits, [self._sampling_row(r) for r in reqs], plan.masks)
                self._output_logprobs(reqs, rows_logits, sampled.token_ids, sampled.logprobs)
            for (i, _), req, tok in zip(plan.sample, reqs, sampled.token_ids):
                sent = len(req.output_ids)
                req.output_ids.append(tok)
                req.finish = self._check_finish(req, tok)
                valid = sent
                if req.finish is None and req.grammar is not None:
                    valid = min(valid, self._jump_forward(req))
                new_tokens[i] = (req.output_ids[valid:], sent - valid)
        for i, r0 in plan.verify:
            row = batch.rows[i]
            width = len(row.draft) + 1
            known = None if argmax is None else argmax[r0 : r0 + width]
            new_tokens[i] = self._verify(row.req, logits[r0 : r0 + width], row.draft, known)
        outputs: list[TokenOut] = []
        finished: list[Req] = []
        for i, row in enumerate(batch.rows):
            req = row.req
            if row.end >= len(req.input_ids) and not req.input_logprobs_done:
                if req.wants_input_logprobs():
                    _first_input_entry(req)
                req.input_logprobs_done = True
            if i not in new_tokens and row.end == req.seq_len() and req.max_new_tokens == 0:
                req.finish = FinishReason("length", length=0)  # prefill only (scoring)
            if i in new_tokens or req.finish is not None:
                ids, rollback = new_tokens.get(i, ([], 0))
                outputs.append(self.make_output(req, ids, rollback))
            if req.finish is not None:
                finished.append(req)
                self._stop_decoders.pop(req.rid, None)
        return outputs, finished

    def _argmax_all(self, batch: ForwardBatch, plan: LogitsPlan, logits: torch.Tensor) -> list[int]:
        """Every logits row's token when each is a plain argmax (plan.argmax_only): one Sampler call, so one
        device sync a step, where a verify row each would cost its own (on a GPU, ~4 syncs of a 16-row code
        step; docs/benchmarks.md)."""
        rows: list[SamplingRow | None] = [None] * logits.shape[0]
        for i, r0 in plan.sample:
            rows[r0] = self._sampling_row(batch.rows[i].req)
        for i, r0 in plan.verify:
            row = batch.rows[i]
            rows[r0 : r0 + len(row.draft) + 1] = [self._sampling_row(row.req)] * (len(row.draft) + 1)
        return self.sampler(logits, rows).token_ids

    def _verify(self, req: Req, logits: torch.Tensor, draft: list[int], known: list[int] | None = None
                ) -> tuple[list[int], int]:
        """A speculative row: emit the target's token at each position while it equals the draft (the last
        position's token comes free), free the rejected drafts' slots; returns (new ids, rollback). known:
        each position's token when the step's argmax is already taken (_argmax_all)."""
        sent = len(req.output_ids)
        base = req.kv_len - len(draft)  # K/V positions < base are valid: the sequence before the draft
        batched = None
        qs = self.spec.draft_q(req)  # a sampled draft's distributions, or None (a deterministic proposal)
        if known is not None:
            batched = SampleOutput(known, [None] * len(known))
        elif _greedy_unprocessed(req):  # the common case in one argmax: the Sampler's own greedy choice
            batched = self.sampler(logits, [self._sampling_row(req)] * logits.shape[0])
        accepted = 0
        for j in range(len(draft) + 1):
            want = draft[j] if j < len(draft) else None
            if batched is not None:
                tok, value = batched.token_ids[j], batched.logprobs[j]
                ok = tok == want
            else:
                q = qs[j] if qs is not None and want is not None else None
                tok, ok = self._verify_position(req, logits[j : j + 1], want, q)
                value = None
            req.output_ids.append(tok)
            if req.logprob.return_logprob:
                row_logits = logits[j : j + 1]
                if value is None:
                    value = lp.token_logprobs(row_logits, torch.tensor([tok])).item()
                self._output_logprobs([req], row_logits, [tok], [value])
            accepted += ok
            req.finish = self._check_finish(req, tok)
            if req.finish is not None or not ok:
                break
        self._truncate_kv(req, min(base + accepted, req.seq_len()))
        self.spec.on_verified(req, len(draft), accepted, len(req.output_ids) - sent)
        valid = sent
        if req.finish is None and req.grammar is not None:
            valid = min(valid, self._jump_forward(req))
        return req.output_ids[valid:], sent - valid

    def _verify_position(self, req: Req, logits: torch.Tensor, draft: int | None, q: torch.Tensor | None = None
                         ) -> tuple[int, bool]:
        row = self._sampling_row(req)
        mask = None
        if req.grammar is not None:
            mask = self.grammar.masks([req], self.sampler.vocab_size, logits.device)
        if draft is None or req.params.is_greedy:
            tok = self.sampler(logits, [row], mask).token_ids[0]
            return tok, tok == draft
        return verify_sampled(self.sampler, logits, row, mask, draft, q)

    def _sampling_row(self, req: Req) -> SamplingRow:
        return SamplingRow(req.params, req.input_ids, req.output_ids, req.generator,
                           wants_logprob=req.logprob.return_logprob)

    def _jump_forward(self, req: Req) -> int:
        """Append the grammar's forced text (as tokens to run in the next extend step); returns how many
        output tokens survive unchanged (the rest were re-tokenized)."""
        jump = self.grammar.jump_forward(req)
        if jump is None:
            return len(req.output_ids)
        drop, new = jump
        if drop:
            del req.output_ids[-drop:]
            # The dropped tokens' K/V (all but the just-sampled one, which has none) are stale.
            self._truncate_kv(req, min(req.kv_len, len(req.input_ids) + len(req.output_ids)))
            self._stop_decoders.pop(req.rid, None)
        valid = len(req.output_ids)
        req.output_ids.extend(new)
        req.num_jump_forward_tokens += len(new)
        if len(req.output_ids) >= req.params.max_new_tokens:
            del req.output_ids[req.params.max_new_tokens:]
            req.finish = FinishReason("length", length=req.params.max_new_tokens)
        elif req.grammar.is_terminated():
            req.finish = FinishReason("stop", matched=None)
        return min(valid, len(req.output_ids))

    def _prompt_logprobs(self, req: Req, p0: int, logits: torch.Tensor) -> None:
        acc, want = req.logprobs, req.logprob
        _first_input_entry(req)
        targets = torch.tensor(req.input_ids[p0 + 1 : p0 + 1 + logits.shape[0]], dtype=torch.int64)
        values = lp.token_logprobs(logits, targets)
        acc.input_token.extend(zip(values.tolist(), targets.tolist()))
        # One top-k for the request and for the radix tree (which keeps a few alternatives a token).
        kept = 0 if req.prompt_logprobs is None else req.prompt_logprobs.top_k
        k = min(max(want.top_logprobs_num, kept), logits.shape[-1])
        top = lp.top_logprobs(logits, k) if k > 0 else None
        prompt_logprobs.record(req, p0 + 1, values, top)
        if want.top_logprobs_num > 0:
            acc.input_top.extend(_top_lists(top, want.top_logprobs_num))
        else:
            acc.input_top.extend([None] * logits.shape[0])
        if want.token_ids_logprob:
            acc.input_ids_logprob.extend(_of_ids(logits, want.token_ids_logprob))
        else:
            acc.input_ids_logprob.extend([None] * logits.shape[0])

    def _output_logprobs(self, reqs: list[Req], logits: torch.Tensor, tokens: list[int], values: list[float]) -> None:
        for j, req in enumerate(reqs):
            if not req.logprob.return_logprob:
                continue
            acc, want = req.logprobs, req.logprob
            acc.output_token.append((values[j], tokens[j]))
            if want.top_logprobs_num > 0:
                acc.output_top.extend(_top(logits[j : j + 1], want.top_logprobs_num))
            if want.token_ids_logprob:
                acc.output_ids_logprob.extend(_of_ids(logits[j : j + 1], want.token_ids_logprob))

    def _check_finish(self, req: Req, token: int) -> FinishReason | None:
        params = req.params
        n = len(req.output_ids)
        if req.grammar is not None:
            if not req.grammar.accept_token(token):
                return FinishReason("abort", message="the sampled token violates the grammar")
            if req.grammar.is_terminated():  # complete: EOS accepted, or nothing can follow
                return FinishReason("stop", matched=token if token in self.eos_token_ids else None)
        if n >= params.max_new_tokens:
            return FinishReason("length", length=params.max_new_tokens)
        if req.seq_len() >= self.context_len:
            return FinishReason("length", length=n)
        if n < params.min_new_tokens:
            return None
        if (not params.ignore_eos and token in self.eos_token_ids) or token in params.stop_token_ids:
            return FinishReason("stop", matched=token)
        if params.stop or params.stop_regex:
            return self._check_stop_strings(req, token)
        return None

    def _check_stop_strings(self, req: Req, token: int) -> FinishReason | None:
        dec = self._stop_decoders.get(req.rid)
        if dec is None:
            dec = IncrementalDecoder(self.tokenizer, req.input_ids, req.params.skip_special_tokens,
                                     req.params.spaces_between_special_tokens)
            self._stop_decoders[req.rid] = dec
        # Tokens the grammar forced since the last check (jump-forward) join the text without being searched,
        # as everything before a decoder's first check: a match must end in a sampled token, but may start in
        # forced text (a stop_regex's lookbehind may need it).
        missed = req.output_ids[dec.num_pushed : len(req.output_ids) - 1]
        if missed:
            dec.push(missed)
        checked = len(dec.text)
        dec.push([token])
        hit = find_stop(dec.text, req.params.stop, checked)
        if hit is None and req.params.stop_regex:
            try:
                hit = find_stop_regex(dec.text, req.params.stop_regex, checked)
            except TimeoutError:
                return FinishReason("abort", message="a stop_regex search took too long")
        # A stop_regex match reports its pattern as `matched`; the output side finds the match again.
        return FinishReason("stop", matched=hit[0]) if hit else None

    def make_output(self, req: Req, new_ids: list[int], rollback: int = 0) -> TokenOut:
        acc = req.logprobs
        out = TokenOut(rid=req.rid, new_ids=new_ids, prompt_tokens=len(req.input_ids),
                       completion_tokens=len(req.output_ids), cached_tokens=req.cached_len,
                       finish=req.finish,
                       num_jump_forward_tokens=req.num_jump_forward_tokens, num_rollback=rollback,
                       num_spec_proposed=req.num_spec_proposed, num_spec_accepted=req.num_spec_accepted,
                       embedding=req.embedding)
        if req.logprob.return_logprob:
            k = len(new_ids)
            out.output_logprobs = acc.output_token[len(acc.output_token) - k :] if k else []
            if req.logprob.top_logprobs_num > 0 and k:
                out.output_top_logprobs = acc.output_top[-k:]
            if req.logprob.token_ids_logprob and k:
                out.output_ids_logprobs = acc.output_ids_logprob[-k:]
            if req.input_logprobs_done and not req.input_logprobs_sent:
                req.input_logprobs_sent = True
                out.input_logprobs = acc.input_token
                out.input_top_logprobs = acc.input_top if req.logprob.top_logprobs_num > 0 else []
                out.input_ids_logprobs = acc.input_ids_logprob if req.logprob.token_ids_logprob else []
        return out


def _greedy_unprocessed(req: Req) -> bool:
    """Greedy with no processor whose effect depends on the tokens before a position (penalties, bias,
    min_new_tokens, grammar): every position's token is then the plain argmax, computed in one call."""
    p = req.params
    return (p.is_greedy and req.grammar is None and not p.logit_bias and p.frequency_penalty == 0.0
            and p.presence_penalty == 0.0 and p.repetition_penalty == 1.0
            and len(req.output_ids) >= p.min_new_tokens)


def _argmax_only(req: Req) -> bool:
    """The request's next token is the argmax of the raw logits and nothing else reads them."""
    return _greedy_unprocessed(req) and not req.logprob.return_logprob


def _first_input_entry(req: Req) -> None:
    """The token at logprob_start has no logprob (nothing before it is scored): a null entry."""
    acc = req.logprobs
    if not acc.input_token:
        acc.input_token.append((None, req.input_ids[req.logprob_start()]))
        acc.input_top.append(None)
        acc.input_ids_logprob.append(None)


def _top(logits: torch.Tensor, k: int) -> list[list[tuple[float, int]]]:
    return _top_lists(lp.top_logprobs(logits, min(k, logits.shape[-1])), k)


def _top_lists(top: tuple[torch.Tensor, torch.Tensor], k: int) -> list[list[tuple[float, int]]]:
    """The first k columns of a top-k (values, ids) as one [(logprob, id), ...] list a row."""
    values, ids = top
    return [list(zip(v, i)) for v, i in zip(values[:, :k].tolist(), ids[:, :k].tolist())]


def _of_ids(logits: torch.Tensor, ids: list[int]) -> list[list[tuple[float, int]]]:
    values = lp.logprobs_of_ids(logits, ids).tolist()
    return [list(zip(v, ids)) for v in values]
