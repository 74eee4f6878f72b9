"""The client tests run against real `cairn serve` processes that tests/e2e/clients.rs starts:

- ``CAIRN_URL`` with ``CAIRN_ADMIN_TOKEN``: a server on the embedded default;
- ``CAIRN_BUSY_URL`` with ``CAIRN_BUSY_ADMIN_TOKEN``: one with one search slot, no queue
  and sixteen connections (`CAIRN_BUSY_CONNECTIONS`), so that 429 and 503 can be met for real.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from cairn_client import Client


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run these tests through tests/e2e/clients.rs")
    return value


@pytest.fixture(scope="session")
def base_url() -> str:
    return _env("CAIRN_URL")


@pytest.fixture(scope="session")
def admin_token() -> str:
    return _env("CAIRN_ADMIN_TOKEN")


@pytest.fixture(scope="session")
def busy_url() -> str:
    return _env("CAIRN_BUSY_URL")


@pytest.fixture(scope="session")
def busy_admin_token() -> str:
    return _env("CAIRN_BUSY_ADMIN_TOKEN")


@pytest.fixture
def admin(base_url: str, admin_token: str) -> Iterator[Client]:
    with Client(base_url, admin_token) as client:
        yield client


@pytest.fixture
def dataset() -> str:
    """A dataset of this test's own."""
    return f"py-{uuid.uuid4().hex[:12]}"


def token_for(admin: Client, scopes: list[str], **fields: object) -> str:
    """A new token's secret."""
    created = admin.create_token(f"py-{uuid.uuid4().hex[:8]}", scopes, **fields)  # type: ignore[arg-type]
    assert created.secret, created
    return created.secret
