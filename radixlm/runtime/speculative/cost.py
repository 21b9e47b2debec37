"""Which drafts pay for themselves: a step's cost against what an accepted token saves.

Runs in the scheduler process. A forward of `rows` decoding rows and n tokens in all costs about
STEP + ROW * rows + DRAFT_TOKEN * (n - rows) 1-row decode steps: the weights are read once per step, and
each row and each draft token adds compute (least squares over the CPU's measured forwards with the
packed fp32 layout, 1-16 rows x 1-9 tokens, within 25%: docs/benchmarks.md, session 26). An accepted draft
token saves one decode row's share of a step, (STEP + ROW * rows) / rows, so a draft token is worth
verifying when its chance of acceptance times that share is at least its own cost: a 1-in-10 chance at
batch 1 (long shots pay), 3 in 10 at 8 rows and 1 in 3 at 16 (only drafts the request's history backs).
"""

from __future__ import annotations

STEP = 0.77  # the fixed part of a step (the weights read once)
ROW = 0.23  # each decode row (its attention, activations, sampling)
DRAFT_TOKEN = 0.096  # each draft token in a verify row (a row's compute, the weights already read)
# A step of 8+ rows verifies drafts only when they are expected to return at least VERIFY_STEP 1-row steps
# (controller._step_pays; otherwise only requests on a streak of whole accepted drafts keep theirs): a few
# requests' accepted tokens shorten only their own runs, and a batch runs as long as its slowest request.
# It began as the jump a step's first draft token cost while verify steps ran the torch attention (16
# rows: 1.33-1.41x a step without drafts, session 26, 1.5); with the compiled paged attention serving
# verify rows that jump is gone (0.99-1.06x), and 3.5 is what the replayed bench kept: free text at batch
# 8 / 12 / 16 drafts nothing (39 / 34 / 91 draft tokens at 1.75), json / code / chat unchanged from 0.5 to 6.
# STEP / ROW / DRAFT_TOKEN predate the compiled ops; refitted to session 27's forwards (0.88 / 0.117 /
# 0.092) the 16-row threshold rises to 0.53, which lost JSON at batch 16 in the replay (docs/benchmarks.md).
VERIFY_STEP = 3.5


def min_chance(rows: int) -> float:
    """The least probability of acceptance at which a draft token pays, in a step of `rows` decoding rows."""
    rows = max(1, rows)
    return DRAFT_TOKEN * rows / (STEP + ROW * rows)


def min_expected(rows: int) -> float:
    """Expected accepted draft tokens a step of `rows` decoding rows needs before verifying any draft pays
    for the step's jump (VERIFY_STEP, in 1-row decode steps) at a decode row's share each."""
    rows = max(1, rows)
    return VERIFY_STEP * rows / (STEP + ROW * rows)
