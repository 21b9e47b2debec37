"""TraceStore: the program traces clients posted, per tenant (namespace). Runs in the HTTP process.

A tenant lists and reads only the traces posted with its own key (another tenant's trace id is answered
like an unknown one); the admin key sees every tenant's. Bounded: the newest MAX_PER_NAMESPACE traces per
tenant, of the MAX_NAMESPACES tenants that posted most recently.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from radixlm.trace.schema import ProgramTrace, summary

MAX_PER_NAMESPACE = 32
MAX_NAMESPACES = 64


class TraceStore:
    def __init__(self) -> None:
        self._by_ns: OrderedDict[str, OrderedDict[str, ProgramTrace]] = OrderedDict()

    def add(self, namespace: str, trace: ProgramTrace) -> None:
        traces = self._by_ns.pop(namespace, None) or OrderedDict()
        traces.pop(trace.id, None)
        traces[trace.id] = trace
        while len(traces) > MAX_PER_NAMESPACE:
            traces.popitem(last=False)
        self._by_ns[namespace] = traces
        while len(self._by_ns) > MAX_NAMESPACES:
            self._by_ns.popitem(last=False)

    def _visible(self, namespace: str, is_admin: bool) -> list[tuple[str, ProgramTrace]]:
        spaces = self._by_ns.items() if is_admin else [(namespace, self._by_ns.get(namespace, {}))]
        return [(ns, t) for ns, traces in spaces for t in traces.values()]

    def list(self, namespace: str, is_admin: bool) -> list[dict[str, Any]]:
        items = [summary(t) for _, t in self._visible(namespace, is_admin)]
        return sorted(items, key=lambda s: -s["started_at"])

    def get(self, namespace: str, is_admin: bool, trace_id: str) -> ProgramTrace | None:
        for _, trace in self._visible(namespace, is_admin):
            if trace.id == trace_id:
                return trace
        return None
