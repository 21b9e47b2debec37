"""Which drafts pay for themselves: a step's cost against what an accepted token saves.

Runs in the scheduler process. A forward of `rows` decoding rows and n tokens in all costs about
step + row * rows + draft_token * (n - rows) 1-row decode steps (tuning.py): the weights are read
once per step, and each row and each draft token adds compute. An accepted draft token saves one
decode row's share of a step, (step + row * rows) / rows, so a draft token is worth verifying when
its chance of acceptance times that share is at least its own cost: a 1-in-10 chance at batch 1
(long shots pay), 3 in 10 at 8 rows and 1 in 3 at 16 (only drafts the request's history backs). A
large step verifies drafts only when they are expected to return at least `verify_step` 1-row steps
(controller._step_pays): a few requests' accepted tokens shorten only their own runs, and a batch
runs as long as its slowest request.
"""

from __future__ import annotations

from radixlm.runtime.speculative.tuning import TUNING as T


def min_chance(rows: int) -> float:
    """The least probability of acceptance at which a draft token pays, in a step of `rows` decoding rows."""
    rows = max(1, rows)
    return T.draft_token * rows / (T.step + T.row * rows)


def min_expected(rows: int) -> float:
    """Expected accepted draft tokens a step of `rows` decoding rows needs before verifying any draft pays
    for the step's jump (verify_step, in 1-row decode steps) at a decode row's share each."""
    rows = max(1, rows)
    return T.verify_step * rows / (T.step + T.row * rows)
