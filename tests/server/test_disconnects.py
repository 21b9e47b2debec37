"""Client disconnects abort the request in the scheduler (KV freed); n > 1 streams; many streams with random
disconnects leave zero leaked KV slots. All on the shared server."""

from __future__ import annotations

import asyncio
import json
import random
import socket

import httpx

from .conftest import LONG_PARAMS, TENANT_KEYS, assert_healthy, num_running, wait_until

# Runs for minutes unless aborted: "aborted" can only be the disconnect's doing, however slow the machine.
LONG = {"text": "Once upon a time", "sampling_params": LONG_PARAMS}


def abort_count(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith('radixlm_requests_total{finish_reason="abort"}'):
            return float(line.split()[-1])
    return 0.0


def wait_for_abort(client: httpx.Client, before: float) -> None:
    wait_until(lambda: abort_count(client) >= before + 1, "the request was aborted")


def raw_post(server, body: dict) -> None:
    """Send a request, wait until the scheduler runs it, and hang up without reading a byte of the reply."""
    data = json.dumps(body).encode()
    head = (f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TENANT_KEYS[0]}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + data)
        wait_until(lambda: num_running(server) == 1, "the request runs")


def test_disconnect_mid_stream_aborts_the_request(client, server):
    before = abort_count(client)
    with client.stream("POST", "/generate", json={**LONG, "stream": True}) as res:
        lines = res.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data: "))
    wait_for_abort(client, before)  # it cannot have ended otherwise: LONG outlives the test
    assert_healthy(server)


def test_disconnect_before_first_byte_and_non_streaming(client, server):
    for body in ({**LONG, "stream": True}, LONG):
        before = abort_count(client)
        raw_post(server, body)
        wait_for_abort(client, before)
        wait_until(lambda: num_running(server) == 0, "the scheduler let the request go")
    assert_healthy(server)


def test_n_streams_carry_their_index(client, server):
    body = {"text": "The quick", "stream": True, "sampling_params": {"max_new_tokens": 5, "n": 2, "temperature": 0.7,
                                                                      "sampling_seed": 1}}
    finals = {}
    with client.stream("POST", "/generate", json=body) as res:
        for line in res.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                if event["meta_info"]["finish_reason"]:
                    finals[event["index"]] = event
    assert sorted(finals) == [0, 1]
    batch = client.post("/generate", json={**body, "stream": False}).json()
    assert [finals[i]["text"] for i in (0, 1)] == [r["text"] for r in batch]
    assert_healthy(server)


async def _one_stream(client: httpx.AsyncClient, rng: random.Random) -> None:
    body = {"text": f"Stream {rng.randrange(1000)} says", "stream": True,
            "sampling_params": {"max_new_tokens": rng.randrange(4, 40), "temperature": 0.8, "ignore_eos": True}}
    stop_after = rng.choice([0, 1, 3, 10, None])
    try:
        async with client.stream("POST", "/generate", json=body) as res:
            if stop_after == 0:
                return  # disconnect before the first event
            seen = 0
            async for line in res.aiter_lines():
                seen += line.startswith("data: ")
                if stop_after is not None and seen >= stop_after:
                    return
    except httpx.HTTPError:
        pass


def test_many_streams_with_random_disconnects_leak_nothing(server):
    async def run() -> None:
        limits = httpx.Limits(max_connections=1000)
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers(), timeout=120,
                                     limits=limits) as client:
            rng = random.Random(0)
            await asyncio.gather(*(_one_stream(client, rng) for _ in range(1000)))

    asyncio.run(run())
    assert_healthy(server)  # zero leaked slots: free + evictable == total, nothing locked, maps empty
