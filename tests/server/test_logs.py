"""What the server logs at --log-level info: the scheduler's periodic status line (SGLang's decode-log
shape) while it has work, and the error's code and message in the access-log line of a 4xx."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from radixlm.runtime.scheduler.status_log import StatusLog

from .conftest import LONG_PARAMS, ServerProcess, wait_until

STATUS = re.compile(r"Decode batch\. #running-req: (\d+), #token: (\d+), token usage: ([\d.]+), "
                    r"cache hit rate: ([\d.]+)%, gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+)")


@pytest.fixture(scope="module")
def info_server(tiny_llama_dir):
    srv = ServerProcess(tiny_llama_dir, "--log-level", "info").wait_ready()
    yield srv
    srv.stop()
    srv.remove_tmpdir()


def test_status_line_while_a_request_runs(info_server):
    with info_server.client() as c, c.stream("POST", "/generate", json={
            "text": "Status", "rid": "status-long", "stream": True, "sampling_params": LONG_PARAMS}) as res:
        lines = res.iter_lines()  # kept: a dropped iterator closes the response (the request is aborted)
        next(line for line in lines if line.startswith("data: "))
        # One line per 10 s while there is work.
        match = wait_until(lambda: next((m for l in info_server.lines if (m := STATUS.search(l))), None),
                           "a status line is logged\n" + "".join(info_server.lines[-20:]))
        assert c.post("/abort_request", json={"rid": "status-long"}).json()["aborted"] is True
    running, tokens, usage, hit, throughput, queued = match.groups()
    assert (int(running), int(queued)) == (1, 0)
    assert int(tokens) > 0 and 0 <= float(usage) <= 1 and float(throughput) > 0 and 0 <= float(hit) <= 100


def test_a_4xx_access_log_line_names_the_error(info_server):
    with info_server.client() as c:
        res = c.post("/generate", json={"text": "x", "sampling_params": {"temprature": 1}})
        assert res.status_code == 400
        rid = res.headers["x-request-id"]
    line = wait_until(lambda: next((l for l in info_server.lines if f"request_id={rid} method=" in l), None),
                      "the access line is logged")
    message = res.json()["error"]["message"]
    assert "status=400" in line and f"code={res.json()['error']['code']}" in line
    assert f"error={json.dumps(message)}" in line, line


def test_status_log_waits_for_the_interval_and_skips_idle():
    now = [0.0]
    log = StatusLog(interval_s=10.0, clock=lambda: now[0])
    kv = SimpleNamespace(allocator=SimpleNamespace(size=1000, num_free=lambda: 700),
                         tree=SimpleNamespace(evictable_size=lambda: 100))
    sched = SimpleNamespace(running=[1, 2], waiting=[3], kv=kv, stats=SimpleNamespace(hit_rate=0.25))
    assert log.maybe_log(sched) is None  # work starts: measured from here
    log.on_outputs([SimpleNamespace(new_ids=[1, 2, 3])] * 10)
    now[0] = 5.0
    assert log.maybe_log(sched) is None  # too soon
    now[0] = 10.0
    assert log.maybe_log(sched) == ("Decode batch. #running-req: 2, #token: 200, token usage: 0.20, cache hit rate: "
                                    "25.00%, gen throughput (token/s): 3.00, #queue-req: 1")
    now[0] = 20.0
    idle = SimpleNamespace(running=[], waiting=[], kv=kv, stats=sched.stats)
    assert log.maybe_log(idle) is None  # idle: no line
    now[0] = 100.0
    assert log.maybe_log(sched) is None  # busy again: the idle time does not count
