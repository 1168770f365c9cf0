"""Model calls through an HTTP proxy (docs/configuration.md#proxies): with HTTPS_PROXY set, a
real server's model calls to a TLS model server go through a CONNECT tunnel of a proxy the
test starts on loopback, with the credentials of the proxy's URL; the proxy sees where the
tunnel goes and nothing of the request (the key crosses it only inside TLS). NO_PROXY skips
it. A proxy URL the client cannot speak to stops the start with one line."""

from __future__ import annotations

import base64
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.app import start
from agentruntime_server.settings import StartupError

from tests.support.auth import Pki
from tests.support.build import agent, create, run
from tests.support.connect_proxy import connect_proxy
from tests.support.model_server import Reply, ScriptedModelServer
from tests.support.servers import serve, server_settings

KEY = "sk-test-secret-never-shown"
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "ALL_PROXY")


@pytest.fixture
def clean_proxies(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


@pytest.fixture
async def tls_model(tmp_path: Path, clean_proxies: pytest.MonkeyPatch) -> AsyncIterator[ScriptedModelServer]:
    """A model server over https for `localhost`, and the server's trust in its CA (SSL_CERT_FILE)."""
    pki = Pki(tmp_path)
    roots = tmp_path / "ca.pem"
    pki.ca.cert_pem.write_to_path(str(roots))
    clean_proxies.setenv("SSL_CERT_FILE", str(roots))
    model = ScriptedModelServer()
    model.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    model.tls.load_cert_chain(pki.cert, pki.key)
    model.script("m", lambda body: Reply(text="through", tokens=5))
    await model.start()
    yield model
    await model.stop()


async def test_model_calls_go_through_the_proxys_tunnel_and_no_proxy_skips_it(
    tls_model: ScriptedModelServer, clean_proxies: pytest.MonkeyPatch
) -> None:
    settings: dict[str, Any] = {"llm_style": "openai", "llm_base_url": tls_model.base_url, "llm_api_key": KEY}
    async with connect_proxy() as proxy:
        clean_proxies.setenv("HTTPS_PROXY", f"http://agent:p%40ss@127.0.0.1:{proxy.port}")
        async with serve(**settings) as served:
            runtime_id = await create(served.stub, agent("m"))
            _, result = await run(served.stub, runtime_id, "m", "go")
        assert (result.status, result.text) == (pb.STATUS_DONE, "through")
        credentials = "Basic " + base64.b64encode(b"agent:p@ss").decode()
        assert proxy.tunnels == [(f"localhost:{tls_model.port}", credentials)]
        assert proxy.sent and KEY.encode() not in proxy.sent and b"chat/completions" not in proxy.sent  # TLS inside

        clean_proxies.setenv("NO_PROXY", "localhost")
        async with serve(**settings) as served:
            runtime_id = await create(served.stub, agent("m"))
            _, result = await run(served.stub, runtime_id, "m", "go")
        assert (result.status, result.text) == (pb.STATUS_DONE, "through")
        assert len(proxy.tunnels) == 1  # the second server went straight to the model
    assert tls_model.calls["m"] == 2


async def test_a_proxy_that_refuses_the_tunnel_fails_the_call_as_unreachable(
    tls_model: ScriptedModelServer, clean_proxies: pytest.MonkeyPatch
) -> None:
    async with connect_proxy() as proxy:
        proxy.refuse = True
        clean_proxies.setenv("HTTPS_PROXY", proxy.url)
        settings: dict[str, Any] = {"llm_style": "openai", "llm_base_url": tls_model.base_url, "llm_api_key": KEY}
        async with serve(**settings) as served:
            runtime_id = await create(served.stub, agent("m"))
            _, result = await run(served.stub, runtime_id, "m", "go")
    assert result.status == pb.STATUS_ERROR
    assert f"the proxy 127.0.0.1:{proxy.port} refused a tunnel to localhost:{tls_model.port} (HTTP 403)" in result.text
    assert tls_model.calls["m"] == 0


async def test_a_proxy_url_the_client_cannot_speak_to_stops_the_start(clean_proxies: pytest.MonkeyPatch) -> None:
    clean_proxies.setenv("HTTPS_PROXY", "https://proxy.example:3128")
    with pytest.raises(StartupError, match="HTTPS_PROXY must be an http:// URL"):
        await start(server_settings())
