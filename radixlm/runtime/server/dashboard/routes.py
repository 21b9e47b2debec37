"""The dashboard's routes. Runs in the HTTP process.

/dashboard and /dashboard/programs are static page shells (public: they hold no data, and a browser must
load them before it can send a key; the page asks for the key and sends it as a Bearer header). The data:
- GET /dashboard/snapshot: the page's JSON (hub.py), GET /dashboard/events: the same as server-sent
  events, twice a second. Read-only. When an admin key is configured only it may read them (401 without a
  valid key, 403 with a tenant's); without one, whoever may run server-wide actions (an open server, or
  SGLang's single --api-key), so a tenant of a multi-tenant server never sees the others' cache.
- /dashboard/programs/traces: POST a program trace (radixlm/trace/schema.py), GET the list, GET one by id;
  each key sees the traces posted with it, the admin key all.
"""

from __future__ import annotations

import asyncio
import time
from importlib import resources
from typing import AsyncIterator

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixlm.runtime.server.context import Ctx
from radixlm.runtime.server.dashboard.hub import DashboardHub
from radixlm.runtime.server.dashboard.programs import TraceStore
from radixlm.runtime.server.errors import APIError
from radixlm.trace.html import VIEWER_CSS, VIEWER_JS
from radixlm.trace.schema import decode_trace, encode_trace

router = APIRouter(include_in_schema=False)

_STATIC = resources.files("radixlm.runtime.server.dashboard") / "static"
_MIME = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}
ASSETS = ("dashboard.js", "dashboard.css", "programs.js")
PAGES = {"/dashboard": "index.html", "/dashboard/programs": "programs.html"}
# The paths the auth middleware lets through without a key (exact raw paths).
PUBLIC_PATHS = frozenset({*PAGES, *(f"/dashboard/assets/{name}" for name in (*ASSETS, "trace.js", "trace.css"))})
EVENT_INTERVAL_S = 0.5
EVENT_STREAM_MAX_S = 600.0  # a viewer's stream ends after this; the page reconnects (frees stale streams)


def _static(name: str) -> Response:
    data = (_STATIC / name).read_bytes()
    return Response(data, media_type=_MIME[name[name.rfind("."):]], headers={"Cache-Control": "no-cache"})


def hub_of(request: Request) -> DashboardHub:
    return request.app.state.dashboard


def traces_of(request: Request) -> TraceStore:
    return request.app.state.program_traces


def check_viewer(request: Request, ctx: Ctx) -> bool:
    """Raise unless this caller may see the dashboard's data; returns whether it holds the admin key."""
    state = request.state
    if ctx.config.admin_api_key:
        if state.is_admin:
            return True
        if ctx.config.api_keys:  # the middleware already refused a missing or wrong key with a 401
            raise APIError(403, "the dashboard needs the admin API key", None, "admin_only")
        raise APIError(401, "the dashboard needs the admin API key", None, "invalid_api_key")
    if not state.is_operator:
        raise APIError(403, "the dashboard of a multi-tenant server needs --admin-api-key", None, "admin_only")
    return False


@router.get("/dashboard")
async def dashboard_page() -> Response:
    return _static("index.html")


@router.get("/dashboard/programs")
async def programs_page() -> Response:
    return _static("programs.html")


@router.get("/dashboard/assets/{name}")
async def asset(name: str) -> Response:
    if name == "trace.js":  # the trace viewer is shared with the self-contained files lang writes
        return Response(VIEWER_JS, media_type=_MIME[".js"], headers={"Cache-Control": "no-cache"})
    if name == "trace.css":
        return Response(VIEWER_CSS, media_type=_MIME[".css"], headers={"Cache-Control": "no-cache"})
    if name not in ASSETS:
        raise APIError(404, "unknown route", None, "not_found")
    return _static(name)


@router.get("/dashboard/snapshot")
async def snapshot(request: Request, ctx: Ctx) -> Response:
    is_admin = check_viewer(request, ctx)
    hub = hub_of(request)
    await hub.refresh()
    return JSONResponse(await hub.view(is_admin))


@router.get("/dashboard/events")
async def events(request: Request, ctx: Ctx) -> Response:
    is_admin = check_viewer(request, ctx)
    hub = hub_of(request)

    async def stream() -> AsyncIterator[bytes]:
        end = time.monotonic() + EVENT_STREAM_MAX_S
        while ctx.tm.state == "ok" and time.monotonic() < end:  # draining: let the server exit
            await hub.refresh()
            yield b"data: " + msgspec.json.encode(await hub.view(is_admin)) + b"\n\n"
            await asyncio.sleep(EVENT_INTERVAL_S)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


# ---- program traces ---------------------------------------------------------------------------------
@router.post("/dashboard/programs/traces")
async def post_trace(request: Request) -> Response:
    body = await request.body()
    try:
        trace = decode_trace(body)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise APIError(400, f"invalid program trace: {exc}", None, "invalid_trace") from None
    traces_of(request).add(request.state.namespace, trace)
    return JSONResponse({"id": trace.id, "url": f"/dashboard/programs#{trace.id}"})


@router.get("/dashboard/programs/traces")
async def list_traces(request: Request) -> Response:
    return JSONResponse({"traces": traces_of(request).list(request.state.namespace, request.state.is_admin)})


@router.get("/dashboard/programs/traces/{trace_id}")
async def get_trace(trace_id: str, request: Request) -> Response:
    trace = traces_of(request).get(request.state.namespace, request.state.is_admin, trace_id)
    if trace is None:
        raise APIError(404, f"no program trace {trace_id!r}", "trace_id", "not_found")
    return Response(encode_trace(trace), media_type="application/json")
