"""radixlm's own frontend (radixlm.lang RuntimeEndpoint) driving the real server: gen, select, fork, stream,
flush_cache and server info, with results checked against the native API."""

from __future__ import annotations

import pytest

import radixlm as sgl
from radixlm.lang.backend.runtime_endpoint import RuntimeEndpointError

from .conftest import ADMIN_KEY, TENANT_KEYS, assert_healthy


def test_lang_programs_against_the_server(server, client):
    backend = sgl.RuntimeEndpoint(server.url, api_key=TENANT_KEYS[0])
    admin = sgl.RuntimeEndpoint(server.url, api_key=ADMIN_KEY)

    @sgl.function
    def prog(s):
        s += "The quick brown fox" + sgl.gen("a", max_tokens=6, temperature=0)
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f" {i}" + sgl.gen("b", max_tokens=3, temperature=0)
        s += " and" + sgl.select("c", choices=[" Paris", " Rome"])

    try:
        state = prog.run(backend=backend)
        ref = client.post("/generate", json={"text": "The quick brown fox",
                                             "sampling_params": {"max_new_tokens": 6, "temperature": 0}}).json()
        assert state["a"] == ref["text"]
        assert state["c"] in (" Paris", " Rome")
        streamed = prog.run(backend=backend, stream=True)
        assert "".join(streamed.text_iter("a")) == ref["text"]
        # The forks and the select still run after "a" has streamed; the server (like SGLang's) refuses a
        # flush while requests run, so read the stream to the program's end first.
        assert "".join(streamed.text_iter()).endswith(("Paris", "Rome"))
        # Flushing the shared cache is the admin's (docs/server.md): a tenant key gets a clear 403.
        with pytest.raises(RuntimeEndpointError, match="admin API key"):
            backend.flush_cache()
        admin.flush_cache()
        assert backend.get_server_info()["max_total_num_tokens"] > 0
    finally:
        backend.shutdown()
        admin.shutdown()
    assert_healthy(server)
