"""SpeculationTuning: every tuned constant of speculative decoding, each with its reason.

Values were chosen by replaying recorded workloads (benchmarks/replay_speculative.py), checked with
benchmarks/bench_speculative.py; what they did to those runs is in docs/benchmarks.md ("Speculative
decoding"). A "large step" has `large_batch`+ decoding rows: its verify tokens are compute-bound.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpeculationTuning:
    # ---- controller.py: which requests draft, and how much ----
    # A suffix match this long is proposed even while paused: a long repeat is copied text
    strong_match: int = 6
    # Acceptance average from which a request counts as copying (JSON ~0.4-0.6)
    copying_acceptance: float = 0.35
    # Decoding rows from which a step is compute-bound and each draft token costs compute
    large_batch: int = 8
    # Draft cap in a large step: drafts past 4 tokens are mostly cut there
    large_batch_max_draft: int = 4
    # ... lifted after this many drafts accepted whole (a request copying long runs)
    large_batch_streak: int = 2
    # A lone row's one-call decode is far cheaper than a verify row: only likely drafts
    one_row_chance: float = 0.35
    # Drop drafts whose first token's chance does not pay for them (cost.py)
    cost_aware: bool = True
    # Fresh requests are explored only if this share of the rows draft (not chance matches)
    explore_share: float = 0.5
    # Finished text settled per step: keeps a step's host time below a GPU step
    settle_tokens: int = 256
    # ... or 1/settle_spread of the backlog, so a large backlog still drains
    settle_spread: int = 16

    # ---- ngram_proposer.py: which n-gram proposal, and how much of an own-text draft ----
    # A copying request accepts a 1-token match: a copied value starts after a quote
    copying_min_match: int = 1
    # A non-copying request in a large step needs a longer match: short ones miss
    large_batch_extra_match: int = 2
    # A character lookup needs this many characters (the token suffix already failed)
    text_min_chars: int = 1
    # Own-text drafts stop where other occurrences of the last 2 tokens part ...
    own_agree_context: int = 2
    # ... keeping at least this many tokens (the text is ambiguous there)
    own_agree_min: int = 1
    # Weight of the latest own-text draft in that request's own-text acceptance
    own_ema_weight: float = 0.3
    # Below this own-text acceptance a large step caps own-text drafts ...
    own_weak_acceptance: float = 0.5
    # ... at this many tokens (a copied value ends where its source goes on)
    own_weak_max_draft: int = 2
    # Own-text acceptance before any is verified: just below the bar (one whole hit lifts it)
    own_prior: float = 0.45
    # Source positions of a request's latest accepted copies that its lookups prefer
    cursors: int = 3
    # A new request shares this many leading tokens with an index before copying it
    adopt_min: int = 64
    # Finished requests' indexes kept as donors (a conversation's next turn)
    donor_tokens: int = 1 << 14

    # ---- ngram.py / text_lookup.py / follow.py / copy_breaks.py / stop_cut.py: lookups ----
    # An occurrence this close after a cursor wins over the latest one (copies go in order)
    cursor_window: int = 64
    # Unindexed tokens a lookup scans rather than indexes (observe indexes off the step)
    tail_scan_max: int = 32
    # The longest character suffix a text lookup tries
    text_max_chars: int = 32
    # Characters of continuation tokenized per draft token wanted
    chars_per_token: int = 8
    # Agreement with a followed source counted back this far (beats any n-gram)
    follow_max_agreement: int = 64
    # Tokens that must match to rejoin a source after a departure ...
    resync_match: int = 2
    # ... searched this far on, for as long as the request wrote this few tokens since
    resync_window: int = 24
    # A copy inside a prompt is this long: shorter repeats are chance and teach nothing
    prompt_copy_min: int = 6
    # Output tokens before a draft whose text a stop string may straddle
    stop_tail_tokens: int = 4

    # ---- adaptive.py: per-request draft length and pauses ----
    # Weight of the latest step in the acceptance average
    ema_weight: float = 0.3
    # Acceptance average above which the draft length grows by one
    grow_above: float = 0.6
    # Decode steps without speculation after the first turn-off
    first_cooldown: int = 8
    # The cool-down doubles up to this
    max_cooldown: int = 256
    # A new request's first-token chance: above a 16-row step's bar, below it after a miss
    first_prior: float = 0.5
    # Decay per draft of the first-token hit counts
    first_decay: float = 0.8
    # Large-step lookups with no verified draft before lookups are skipped ...
    dry_lookups: int = 8
    # ... for this many steps (their host time is a GPU step's) ...
    dry_skip: int = 8
    # ... doubling up to this
    dry_max_skip: int = 64

    # ---- cost.py: a step's cost in 1-row decode steps (fit to the CPU's forwards) ----
    # The fixed part of a step (the weights read once)
    step: float = 0.77
    # Each decode row (its attention, activations, sampling)
    row: float = 0.23
    # Each draft token in a verify row (compute; the weights already read)
    draft_token: float = 0.096
    # Expected 1-row steps a large step's drafts must save: a batch runs as its slowest row
    verify_step: float = 3.5


TUNING = SpeculationTuning()
