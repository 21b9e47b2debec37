"""SpecStats: speculative decoding's totals since start (verify rows, proposed / accepted / emitted tokens).

Runs in the scheduler process: the controller counts each verified draft; the status log line, the server
info and /metrics read them (a data-parallel server merges its ranks' sums: server/dp_dispatch.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    """Totals since start (the status log line and the server info read them)."""

    num_verify_rows: int = 0  # rows that carried a draft
    num_proposed: int = 0
    num_accepted: int = 0
    num_emitted: int = 0  # tokens those rows produced (accepted + the one sampled after them)
    per_k: dict[int, int] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_proposed if self.num_proposed else 0.0

    def to_dict(self) -> dict[str, float]:
        rows = max(1, self.num_verify_rows)
        return {"spec_verify_rows": self.num_verify_rows, "spec_proposed_tokens": self.num_proposed,
                "spec_accepted_tokens": self.num_accepted, "spec_acceptance_rate": self.acceptance_rate,
                "spec_tokens_per_verify_row": self.num_emitted / rows}
