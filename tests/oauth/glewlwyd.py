"""Provisions a running glewlwyd (Debian's OAuth 2.1/OIDC server, scripts/setup-oauth) through its
own admin API, as an operator would through its admin pages: an OIDC plugin that signs JWT access
tokens with an ECDSA key, allows PKCE, dynamic client registration and resource indicators for
cairn's resource; cairn's scopes; `groups` and `preferred_username` user properties that land in the access token; and
the users the test signs in as. Run by tests/e2e/sign_in.rs:

    glewlwyd.py provision CONFIG.json     # CONFIG: base, issuer, resource, key, cert, users
    glewlwyd.py rotate CONFIG.json        # replaces the signing key with CONFIG's `key`/`cert`

Prints `ok` and exits 0, or raises.
"""

import json
import sys

import httpx2

PLUGIN = "oidc"
SCOPES = ["cairn.search", "cairn.ingest", "cairn.admin"]


def admin(config):
    client = httpx2.Client(base_url=config["base"] + "/api", timeout=10)
    answer = client.post("/auth/", json={"username": "admin", "password": "password"})
    assert answer.status_code == 200, answer.text
    return client


def expect(answer, *statuses):
    assert answer.status_code in statuses, f"{answer.request.method} {answer.request.url}: {answer.status_code} {answer.text}"
    return answer


def plugin_parameters(config):
    return {
        "iss": config["issuer"],
        "jwt-type": "ecdsa",
        "jwt-key-size": "256",
        "key": open(config["key"]).read(),
        "cert": open(config["cert"]).read(),
        "jwks-show": True,
        "access-token-duration": config.get("access_token_seconds", 3600),
        "refresh-token-duration": 86400,
        "code-duration": 600,
        "refresh-token-rolling": True,
        "allow-non-oidc": True,
        "auth-type-code-enabled": True,
        "auth-type-token-enabled": False,
        "auth-type-id-token-enabled": True,
        "auth-type-none-enabled": False,
        "auth-type-password-enabled": False,
        "auth-type-client-enabled": True,
        "auth-type-device-enabled": False,
        "auth-type-refresh-enabled": True,
        "subject-type": "public",
        "scope": [],
        "allowed-scope": ["openid"] + SCOPES,
        "pkce-allowed": True,
        "pkce-method-plain-allowed": False,
        "resource-allowed": True,
        "resource-scope": {scope: [config["resource"], config["resource"] + "/mcp"] for scope in SCOPES},
        "resource-scope-and-client-property": False,
        "resource-client-property": "resource",
        "register-client-allowed": True,
        "register-client-auth-scope": [],
        "register-client-credentials-scope": [],
        "register-resource-specify-allowed": True,
        "register-resource-default": [config["resource"], config["resource"] + "/mcp"],
        "register-client-management-allowed": False,
        "introspection-revocation-allowed": True,
        "introspection-revocation-allow-target-client": True,
        # The user's name and groups in the access token (`sub` is an opaque identifier here).
        "additional-parameters": [
            {"user-parameter": "preferred_username", "token-parameter": "preferred_username"},
            {"user-parameter": "groups", "token-parameter": "groups"},
        ],
    }


def provision(config):
    client = admin(config)
    # `groups` and `preferred_username` properties on users, kept by the database user module.
    module = expect(client.get("/mod/user/database"), 200).json()
    module["parameters"]["data-format"]["groups"] = {
        "multiple": True, "read": True, "write": True, "profile-read": True, "profile-write": False,
    }
    module["parameters"]["data-format"]["preferred_username"] = {
        "multiple": False, "read": True, "write": True, "profile-read": True, "profile-write": False,
    }
    expect(client.put("/mod/user/database", json=module), 200)
    expect(client.put("/mod/user/database/reset/"), 200)
    for scope in SCOPES:
        expect(client.post("/scope/", json={
            "name": scope, "display_name": scope, "description": f"cairn {scope}",
            "password_required": True, "password_max_age": 0, "scheme": {},
        }), 200)
    expect(client.post("/mod/plugin/", json={
        "module": "oidc", "name": PLUGIN, "display_name": "cairn's issuer", "parameters": plugin_parameters(config),
    }), 200)
    for user in config["users"]:
        expect(client.post("/user/", json={
            "username": user["name"], "name": user["name"], "password": user["password"], "enabled": True,
            "scope": user["scopes"], "groups": user["groups"], "preferred_username": user["name"],
        }), 200)
    print("ok")


def rotate(config):
    client = admin(config)
    plugin = expect(client.get(f"/mod/plugin/{PLUGIN}"), 200).json()
    plugin["parameters"] = plugin_parameters(config)
    expect(client.put(f"/mod/plugin/{PLUGIN}", json=plugin), 200)
    # The running plugin keeps its old key until it is reloaded.
    expect(client.put(f"/mod/plugin/{PLUGIN}/reset/"), 200)
    print("ok")


if __name__ == "__main__":
    command, path = sys.argv[1], sys.argv[2]
    with open(path) as file:
        config = json.load(file)
    {"provision": provision, "rotate": rotate}[command](config)
