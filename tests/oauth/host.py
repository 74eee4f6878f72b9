"""An agent host signing in to cairn's MCP server with the official Python SDK's OAuth client
(`mcp.client.auth.OAuthClientProvider`, the `mcp` package pinned by scripts/setup-mcp), against a
real authorization server (glewlwyd, provisioned by glewlwyd.py). Run by tests/e2e/sign_in.rs:

    host.py CONFIG.json

CONFIG names `mcp_url`, the authorization server's `base` and the `user` and `password` to sign
in as, and the `query`. The SDK:
  1. calls /mcp and gets cairn's 401 challenge;
  2. reads cairn's protected resource metadata, then the server's metadata;
  3. registers as a client (dynamic registration);
  4. runs authorization code with PKCE and the `resource` parameter; this script plays the user
     at the server's login and consent steps (the calls glewlwyd's login page makes);
  5. exchanges the code for a token and calls `search`.
Prints one JSON line: the source keys `search` answered, the scopes granted, the access token
and the registered client's credentials (for the test's own checks), and exits 0; raises on
any failure. `extra_grant_types` in CONFIG adds grant types to the registration (glewlwyd lets
a client introspect and revoke its own tokens once it may use `client_credentials`).
"""

import json
import sys
from urllib.parse import parse_qs, urlparse

import anyio
import httpx2
from mcp.client import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

REDIRECT_URI = "http://127.0.0.1:9/callback"


class Memory(TokenStorage):
    """What a host keeps between calls, in memory."""

    def __init__(self):
        self.tokens = None
        self.client_info = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class User:
    """The person at the browser: signs in at the server with a password, consents to the
    scopes the client asked for, and lands on the redirect URI with a code."""

    def __init__(self, config):
        self.config = config
        self.landed = None

    async def visit(self, authorization_url: str) -> None:
        query = parse_qs(urlparse(authorization_url).query)
        assert query.get("code_challenge_method") == ["S256"], query
        assert query.get("resource"), f"no resource parameter: {query}"
        async with httpx2.AsyncClient(base_url=self.config["base"] + "/api", timeout=10) as browser:
            # The server sends the browser to its login page, which takes it back to the
            # authorization endpoint (`callback_url`) once the user signed in and consented.
            answer = await browser.get(authorization_url, follow_redirects=False)
            assert answer.status_code == 302, f"{answer.status_code} {answer.text}"
            login = parse_qs(urlparse(answer.headers["location"]).query)
            assert "callback_url" in login, answer.headers["location"]
            signed_in = await browser.post(
                "/auth/", json={"username": self.config["user"], "password": self.config["password"]}
            )
            assert signed_in.status_code == 200, signed_in.text
            consent = await browser.put(
                f"/auth/grant/{query['client_id'][0]}", json={"scope": " ".join(self.config["consent"])}
            )
            assert consent.status_code == 200, consent.text
            answer = await browser.get(login["callback_url"][0] + "&g_continue", follow_redirects=False)
            assert answer.status_code == 302, f"{answer.status_code} {answer.text}"
            self.landed = answer.headers["location"]
        assert self.landed.startswith(REDIRECT_URI), self.landed

    async def callback(self) -> AuthorizationCodeResult:
        query = parse_qs(urlparse(self.landed).query)
        assert "code" in query, f"no code: {self.landed}"
        return AuthorizationCodeResult(code=query["code"][0], state=query.get("state", [None])[0])


async def main(config):
    storage = Memory()
    user = User(config)
    auth = OAuthClientProvider(
        server_url=config["mcp_url"],
        client_metadata=OAuthClientMetadata(
            client_name="cairn sign-in test host",
            redirect_uris=[REDIRECT_URI],
            grant_types=["authorization_code", "refresh_token"] + config.get("extra_grant_types", []),
            response_types=["code"],
            token_endpoint_auth_method="client_secret_basic",
        ),
        storage=storage,
        redirect_handler=user.visit,
        callback_handler=user.callback,
    )
    http = create_mcp_http_client(auth=auth)
    async with Client(streamable_http_client(config["mcp_url"], http_client=http), cache=None) as client:
        result = await client.call_tool("search", {"query": config["query"], "top_k": 10})
    data = result.model_dump(by_alias=True, exclude_none=True)
    structured = data.get("structuredContent") or {}
    assert not data.get("isError"), data
    keys = sorted({hit["source_key"] for hit in structured.get("hits", [])})
    assert storage.tokens is not None and storage.client_info is not None
    print(json.dumps({
        "keys": keys,
        "scope": storage.tokens.scope,
        "client_id": storage.client_info.client_id,
        "client_secret": storage.client_info.client_secret,
        "access_token": storage.tokens.access_token,
    }))


if __name__ == "__main__":
    with open(sys.argv[1]) as file:
        anyio.run(main, json.load(file))
