"""Stored Responses (`store: true`, OpenAI's default): GET /v1/responses/{id} and previous_response_id.

Runs in the HTTP process (one event loop: no locking). Bounded: the least recently used response goes first
once `capacity` are stored (--max-stored-responses). Tenant-scoped: entries are keyed by the API key's
namespace, so a tenant never reads, continues or deletes another's response (it is simply not found).
A stored conversation shares the item dicts of the responses it continues (lists of references), so a
long chain costs one copy of each item plus a reference per item and response.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as returned
    items: list[dict[str, Any]]  # the conversation through this response's output (instructions excluded)


class ResponseStore:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, str], StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, namespace: str, entry: StoredResponse) -> None:
        if self.capacity < 1:
            return
        key = (namespace, entry.response["id"])
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, namespace: str, response_id: str) -> StoredResponse | None:
        entry = self._entries.get((namespace, response_id))
        if entry is not None:
            self._entries.move_to_end((namespace, response_id))
        return entry

    def delete(self, namespace: str, response_id: str) -> bool:
        return self._entries.pop((namespace, response_id), None) is not None
