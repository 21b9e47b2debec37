"""Prefix-cache statistics kept by the scheduler (exposed by the engine, the server's metrics and
/server_info). Runs in the scheduler process."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class CacheStats:
    num_requests: int = 0
    prompt_tokens: int = 0  # prompt tokens of admitted requests (first admission only)
    cached_tokens: int = 0  # of which served from the radix cache
    num_retractions: int = 0

    def record_prompt(self, prompt_len: int, cached_len: int) -> None:
        self.num_requests += 1
        self.prompt_tokens += prompt_len
        self.cached_tokens += cached_len

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "hit_rate": self.hit_rate}
