"""cairn's typed errors as exceptions, met for real: 401, 403, 404, 409, 422 on the default
server; 429 and 503 on the busy one (one search slot and no queue; sixteen connections), with
the retry budget honoured."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from cairn_client import (
    AuthenticationError,
    CairnError,
    Client,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    Retry,
    UnavailableError,
)
from conftest import token_for

NO_RETRY = Retry(attempts=1)


def test_401_403_404_409_422(admin: Client, base_url: str, dataset: str) -> None:
    with Client(base_url, "cairn_not_a_token") as stranger, pytest.raises(AuthenticationError) as e:
        stranger.search("anything")
    assert e.value.status == 401 and e.value.code

    reader = token_for(admin, ["search"])
    with Client(base_url, reader) as client, pytest.raises(PermissionDeniedError) as e:
        client.put_source(dataset, "a.md", "a reader may not write")
    assert e.value.status == 403 and e.value.code == "forbidden", e.value

    with pytest.raises(NotFoundError) as e:
        admin.revision(str(uuid.uuid4()))
    assert e.value.status == 404

    own = admin.token_self()["token_id"]
    with pytest.raises(ConflictError) as e:
        admin.revoke_token(own, reason="a token may not revoke itself")
    assert e.value.status == 409 and e.value.code == "own_token"

    with pytest.raises(InvalidRequestError) as e:
        admin.search("heron", filter={"field": "colour", "eq": "grey"})
    assert e.value.status == 422 and e.value.code.startswith("filter_"), e.value
    assert e.value.message

    # Every one of them is a CairnError, and none was retried.
    retried: list[CairnError] = []
    with (
        Client(base_url, "cairn_not_a_token", on_retry=lambda err, pause: retried.append(err)) as c,
        pytest.raises(CairnError),
    ):
        c.token_self()
    assert retried == []


def _searches(url: str, token: str, retry: Retry, count: int, hook=None) -> list[object]:
    def one(n: int) -> object:
        with Client(url, token, retry=retry, on_retry=hook) as client:
            try:
                return client.search(f"query number {n} about herons", mode="vector")
            except CairnError as error:
                return error

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(one, range(count)))


def test_429_is_typed_and_retried_within_the_budget(busy_url: str, busy_admin_token: str) -> None:
    refused: list[RateLimitedError] = []
    for _ in range(20):
        answers = _searches(busy_url, busy_admin_token, NO_RETRY, 12)
        refused = [a for a in answers if isinstance(a, RateLimitedError)]
        assert all(
            isinstance(a, RateLimitedError) or not isinstance(a, CairnError) for a in answers
        ), answers
        if refused:
            break
    assert refused, "twelve searches at once never met a full single slot"
    assert refused[0].status == 429 and refused[0].code == "overloaded"
    assert refused[0].retry_after is not None and refused[0].retry_after > 0

    # With a budget, the same load is answered: each refusal waits its Retry-After.
    retries: list[float] = []
    answers = _searches(
        busy_url,
        busy_admin_token,
        Retry(attempts=100, budget=120),
        12,
        hook=lambda err, pause: retries.append(pause),
    )
    assert not [a for a in answers if isinstance(a, CairnError)], answers

    # A budget smaller than Retry-After gives up at once instead of sleeping past it.
    for _ in range(20):
        started = time.monotonic()
        answers = _searches(busy_url, busy_admin_token, Retry(attempts=5, budget=0.01), 12)
        if any(isinstance(a, RateLimitedError) for a in answers):
            break
    else:
        pytest.fail("no 429 met again")
    assert time.monotonic() - started < 30


def test_503_is_typed_and_retried(busy_url: str, busy_admin_token: str) -> None:
    host, port = urlsplit(busy_url).hostname, urlsplit(busy_url).port
    assert host and port
    # Hold every connection the busy server serves, idle.
    cap = int(os.environ.get("CAIRN_BUSY_CONNECTIONS", "16"))
    held = [socket.create_connection((host, port)) for _ in range(cap)]
    try:
        time.sleep(0.2)
        with Client(busy_url, busy_admin_token, retry=NO_RETRY) as client:
            with pytest.raises(UnavailableError) as e:
                client.token_self()
            assert e.value.status == 503 and e.value.code == "overloaded"
            assert e.value.retry_after is not None

        # Released a moment later: a client with a budget gets its answer.
        threading.Timer(0.5, lambda: [s.close() for s in held]).start()
        pauses: list[float] = []
        with Client(
            busy_url,
            busy_admin_token,
            retry=Retry(attempts=20, budget=60),
            on_retry=lambda err, pause: pauses.append(pause),
        ) as client:
            assert client.token_self()["scopes"]
        assert pauses, "the first try met the cap"
    finally:
        for s in held:
            s.close()
