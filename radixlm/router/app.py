"""The router's HTTP app: the native and OpenAI routes of several `radixlm serve` replicas behind one port.

Runs in the router process (one asyncio loop, so the policy needs no locks). Generation routes go to the
replica the policy picks; a replica that refuses the connection or drops the request before its answer
is complete is marked unhealthy and the request is retried on another one (a stream that has already
sent bytes cannot be retried). A background task polls every replica's /health and brings replicas
back. Bodies are relayed as bytes: the router never re-encodes what the replicas say.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import AsyncIterator

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from radixlm.router.policy import Policy, Replica, RouterConfig, route_key

logger = logging.getLogger(__name__)

ROUTED_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/encode")
INFO_PATHS = ("/v1/models", "/get_model_info", "/model_info", "/get_server_info", "/server_info")
_FORWARD_HEADERS = ("authorization", "content-type", "x-request-id")
_RETURN_HEADERS = ("content-type", "retry-after", "x-request-id")


def create_app(config: RouterConfig) -> FastAPI:
    policy = Policy(config)
    client = httpx.AsyncClient(timeout=httpx.Timeout(config.request_timeout_s, connect=5.0))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(_health_loop(policy, client, config.health_interval_s))
        yield
        task.cancel()
        await client.aclose()

    app = FastAPI(title="radixlm router", lifespan=lifespan)
    app.state.policy = policy
    for path in ROUTED_PATHS:
        app.add_api_route(path, _routed(policy, client, path), methods=["POST"])
    for path in INFO_PATHS:
        app.add_api_route(path, _any_replica(policy, client, path), methods=["GET"])
    _install_admin_routes(app, policy, client)
    return app


def _routed(policy: Policy, client: httpx.AsyncClient, path: str):
    async def route(request: Request) -> Response:
        body = await request.body()
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None  # the replica answers with its own 400
        key = route_key(path, obj, request.headers.get("authorization", ""))
        stream = isinstance(obj, dict) and obj.get("stream") is True
        return await _dispatch(policy, client, request, path, body, stream,
                               lambda exclude: policy.choose(key, exclude))

    return route


def _any_replica(policy: Policy, client: httpx.AsyncClient, path: str):
    async def info(request: Request) -> Response:
        def first(exclude: frozenset[str]) -> Replica | None:
            healthy = policy.healthy(exclude)
            return healthy[0] if healthy else None

        return await _dispatch(policy, client, request, path, None, False, first, method="GET")

    return info


async def _dispatch(policy: Policy, client: httpx.AsyncClient, request: Request, path: str,
                    body: bytes | None, stream: bool, pick, method: str = "POST") -> Response:
    """Send to the picked replica; on a transport failure mark it down and try the next one."""
    tried: set[str] = set()
    last: Response | None = None
    headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARD_HEADERS}
    while (replica := pick(frozenset(tried))) is not None:
        tried.add(replica.url)
        replica.load += 1
        try:
            resp = await client.send(client.build_request(method, replica.url + path, content=body,
                                                          headers=headers), stream=True)
            if not stream or resp.status_code != 200:
                content = await resp.aread()  # inside the try: a replica dying mid-answer fails over
        except httpx.TransportError as exc:
            replica.load -= 1
            replica.num_failures += 1
            policy.mark(replica, False)
            logger.warning("replica %s failed (%s); trying another", replica.url, exc)
            continue
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() in _RETURN_HEADERS}
        if stream and resp.status_code == 200:
            return StreamingResponse(_relay(resp, replica), status_code=200, headers=out_headers)
        replica.load -= 1
        last = Response(content, status_code=resp.status_code, headers=out_headers)
        if resp.status_code != 503:  # 503: draining or full; another replica may take it
            return last
    return last or JSONResponse({"error": {"message": "no healthy replica", "type": "service_unavailable",
                                           "param": None, "code": "no_replica"}}, status_code=503)


async def _relay(resp: httpx.Response, replica: Replica) -> AsyncIterator[bytes]:
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    except httpx.TransportError:
        replica.num_failures += 1  # the client sees a truncated stream; the health loop decides the rest
    finally:
        replica.load -= 1
        await resp.aclose()


def _install_admin_routes(app: FastAPI, policy: Policy, client: httpx.AsyncClient) -> None:
    @app.get("/health")
    async def health() -> Response:
        ok = bool(policy.healthy())
        return JSONResponse({} if ok else {"error": "no healthy replica"}, status_code=200 if ok else 503)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        results = await asyncio.gather(*(client.post(r.url + "/flush_cache", headers=headers)
                                         for r in policy.healthy()), return_exceptions=True)
        ok = all(isinstance(r, httpx.Response) and r.status_code == 200 for r in results)
        if ok:
            policy.forget()
        return JSONResponse({"message": "Cache flushed." if ok else "some replicas did not flush"},
                            status_code=200 if ok else 400)

    @app.get("/router/stats")
    async def stats() -> Response:
        return JSONResponse({"policy": policy.config.policy, "replicas": [
            {"url": r.url, "healthy": r.healthy, "load": r.load, "num_routed": r.num_routed,
             "num_failures": r.num_failures, "tree_chars": r.tree.total_size()} for r in policy.replicas]})


async def _health_loop(policy: Policy, client: httpx.AsyncClient, interval_s: float) -> None:
    async def check(replica: Replica) -> None:
        try:
            ok = (await client.get(replica.url + "/health", timeout=5.0)).status_code == 200
        except httpx.TransportError:
            ok = False
        if ok != replica.healthy:
            logger.warning("replica %s is %s", replica.url, "back" if ok else "down")
        policy.mark(replica, ok)

    while True:
        await asyncio.gather(*(check(r) for r in policy.replicas))
        await asyncio.sleep(interval_s)
