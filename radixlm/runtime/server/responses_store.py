"""Stored Responses (`store: true`, OpenAI's default): GET /v1/responses/{id} and previous_response_id.

Runs in the HTTP process (one event loop: no locking). Tenant-scoped and bounded per tenant: each API key's
namespace has its own store of at most `capacity` responses (--max-stored-responses) and `max_bytes` of their
JSON (--max-stored-response-bytes), the least recently used going first; so a tenant never reads, continues,
deletes or evicts another's response (it is simply not found), and the memory is bounded by the number of keys.
A stored conversation shares the item dicts of the responses it continues (lists of references); its size
counts the whole conversation, so a long chain is charged more than it costs, never less.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as returned
    items: list[dict[str, Any]]  # the conversation through this response's output (instructions excluded)
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        size = len(json.dumps(self.response, default=str)) + len(json.dumps(self.items, default=str))
        object.__setattr__(self, "nbytes", size)


class _TenantStore:
    def __init__(self) -> None:
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.nbytes = 0

    def pop_oldest(self) -> None:
        _, entry = self.entries.popitem(last=False)
        self.nbytes -= entry.nbytes


class ResponseStore:
    def __init__(self, capacity: int, max_bytes: int = 256 << 20):
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._tenants: dict[str, _TenantStore] = {}

    def __len__(self) -> int:
        return sum(len(t.entries) for t in self._tenants.values())

    def put(self, namespace: str, entry: StoredResponse) -> None:
        if self.capacity < 1 or entry.nbytes > self.max_bytes:
            return  # too big to keep: not stored, as with store: false
        tenant = self._tenants.setdefault(namespace, _TenantStore())
        self.delete(namespace, entry.response["id"])
        tenant.entries[entry.response["id"]] = entry
        tenant.nbytes += entry.nbytes
        while len(tenant.entries) > self.capacity or tenant.nbytes > self.max_bytes:
            tenant.pop_oldest()

    def get(self, namespace: str, response_id: str) -> StoredResponse | None:
        tenant = self._tenants.get(namespace)
        entry = None if tenant is None else tenant.entries.get(response_id)
        if entry is not None:
            tenant.entries.move_to_end(response_id)
        return entry

    def delete(self, namespace: str, response_id: str) -> bool:
        tenant = self._tenants.get(namespace)
        entry = None if tenant is None else tenant.entries.pop(response_id, None)
        if entry is None:
            return False
        tenant.nbytes -= entry.nbytes
        return True
