"""Req.ids_between is full_ids()[start:end] (what a step's rows feed the model) without building the whole
sequence."""

from __future__ import annotations

import itertools

from radixlm.runtime.scheduler.request import Req
from radixlm.sampling_params import SamplingParams


def test_ids_between_is_a_slice_of_the_full_sequence() -> None:
    req = Req(rid="r", input_ids=[5, 6, 7, 8], params=SamplingParams())
    req.output_ids.extend([100, 101, 102])
    full = req.full_ids()
    for start, end in itertools.combinations_with_replacement(range(len(full) + 2), 2):
        assert req.ids_between(start, end) == full[start:end], (start, end)
