"""Which draft tokens pay for themselves: a step's cost against what an accepted token saves.

Runs in the scheduler process. A forward of `rows` decoding rows and n tokens in all costs about
STEP + ROW * rows + DRAFT_TOKEN * (n - rows) (in units of a 1-row decode step; fitted to the CPU's
measured table in docs/benchmarks.md, session 26: the weights are read once per step, each row and each
draft token adds compute). An accepted draft token saves one decode row's share of a step,
(STEP + ROW * rows) / rows; a draft token is worth verifying when the chance that it is accepted (with
all the drafts before it) times that share is at least its own cost. At batch 1 that is a 1-in-12 chance
(long drafts pay), at batch 16 about 2 in 5 (only drafts the request's history says are likely).
"""

from __future__ import annotations

STEP = 1.0  # a 1-row decode step
ROW = 0.18  # each further decode row (its attention, activations, sampling)
DRAFT_TOKEN = 0.095  # each draft token in a verify row (a row's compute, the weights already read)


def min_chance(rows: int) -> float:
    """The least probability of acceptance at which a draft token pays, in a step of `rows` decoding rows."""
    rows = max(1, rows)
    return DRAFT_TOKEN * rows / (STEP + ROW * rows)
