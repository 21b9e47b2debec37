"""Admin-only debug route: the robustness.md invariants across all three processes, on demand.

Runs in the HTTP process. Enabled only when an admin key is configured; only that key may call it.
The scheduler checks pool and tree integrity (and, when idle, the idle invariants); the detokenizer
and the tokenizer manager report their per-request maps, which must be empty when nothing is in flight.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlm.runtime.server.context import Ctx
from radixlm.runtime.server.errors import APIError

DEBUG_PATH = "/debug/invariants"
router = APIRouter()


@router.get(DEBUG_PATH)
async def invariants(request: Request, ctx: Ctx) -> Response:
    tm = ctx.tm
    if not ctx.config.admin_api_key:
        raise APIError(404, "unknown route", None, "not_found")
    if not request.state.is_admin:
        raise APIError(403, "this route needs the admin API key", None, "admin_only")
    sched = await tm.control("scheduler", "debug_check")
    detok = await tm.control("detokenizer", "debug_state")
    inflight = len(tm.handles)
    failures = [] if sched.ok else [f"scheduler: {sched.error}"]
    if inflight == 0:
        if not sched.data.get("idle", False):
            failures.append("scheduler has work but no request is in flight")
        if detok.data.get("num_states", 0):
            failures.append("detokenizer holds state of finished requests")
        if tm.client_rids or len(tm.streams):
            failures.append("tokenizer manager holds rids or stream state of finished requests")
    body: dict[str, Any] = {
        "ok": not failures, "failures": failures, "scheduler": sched.data, "detokenizer": detok.data,
        "tokenizer_manager": {"num_inflight": inflight, "num_client_rids": len(tm.client_rids),
                              "num_streams": len(tm.streams)},
        "pids": {"server": os.getpid(), **{name: r.pid for name, r in tm.ready.items()}}}
    return JSONResponse(body)
