"""Every client call against a running cairn: receipts followed to verified, a superseded
revision never returned, search with filters and facets, sources, access, tokens, the
change feed, webhooks; the async client the same way."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import uuid

import httpx
import pytest
from cairn_client import (
    AsyncClient,
    Client,
    Receipt,
    RevisionSuperseded,
    WaitTimeout,
)
from cairn_client.models import SearchAnswer
from conftest import token_for


def _keys(answer: SearchAnswer) -> list[str]:
    return [hit.source_key for hit in answer.results]


def test_a_receipt_is_followed_to_verified(admin: Client, dataset: str) -> None:
    receipt = admin.ingest(dataset, "heron.md", "the grey heron waits in the shallows")
    assert isinstance(receipt, Receipt)
    assert receipt.status == "queued_not_confirmed"
    detail = admin.revision(str(receipt.source_revision_id))
    assert detail.job is not None and detail.job.state == "completed", detail.job
    assert detail.receipts and all(r.state == "verified" for r in detail.receipts), detail.receipts
    assert {r.backend for r in detail.receipts} >= {"relational", "vector"}
    # The same bytes again: a duplicate, with the same revision.
    again = admin.put_source(dataset, "heron.md", "the grey heron waits in the shallows")
    assert again.status == "duplicate"
    assert again.source_revision_id == receipt.source_revision_id


def test_a_wait_polls_where_the_feed_is_refused(
    base_url: str, admin_token: str, dataset: str
) -> None:
    """FaultInjectingTransport: answers 404 for the change feed, so the wait must poll."""

    class FaultInjectingTransport(httpx.HTTPTransport):
        feed_calls = 0

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/v1/changes":
                FaultInjectingTransport.feed_calls += 1
                body = json.dumps({"code": "not_found", "message": "no feed here"}).encode()
                return httpx.Response(404, content=body, request=request)
            return super().handle_request(request)

    with Client(base_url, admin_token, transport=FaultInjectingTransport()) as client:
        receipt = client.ingest(dataset, "poll.md", "a kingfisher dives from the alder")
        detail = client.revision(str(receipt.source_revision_id))
    assert all(r.state == "verified" for r in detail.receipts)
    assert FaultInjectingTransport.feed_calls >= 1


def test_a_wait_that_runs_out_says_so_and_the_revision_stays_accepted(
    admin: Client, dataset: str
) -> None:
    with pytest.raises(WaitTimeout) as caught:
        admin.ingest(dataset, "slow.md", "an owl at dusk over the stubble field", timeout=0.0)
    assert caught.value.code == "wait_timeout"
    (revision,) = caught.value.details["revisions"]
    assert admin.revision(revision).revision.source_key == "slow.md"


def test_a_superseded_revision_is_never_returned(admin: Client, dataset: str) -> None:
    first = admin.ingest(dataset, "river.md", "the otter swims under the old stone bridge")
    second = admin.ingest(dataset, "river.md", "the beaver builds a dam across the millstream")
    for mode in ("vector", "lexical", "auto"):
        answer = admin.search("otter swims stone bridge", datasets=[dataset], mode=mode)
        revisions = {str(hit.source_revision_id) for hit in answer.results}
        assert str(first.source_revision_id) not in revisions, (mode, answer)
        assert all("otter" not in hit.text for hit in answer.results), (mode, answer)
    answer = admin.search("beaver dam millstream", datasets=[dataset], mode="lexical")
    assert [str(hit.source_revision_id) for hit in answer.results] == [
        str(second.source_revision_id)
    ]
    # The source's view holds both revisions, the head the second.
    view = admin.get_source(dataset, "river.md")
    assert str(view.head.id) == str(second.source_revision_id)
    assert len(view.revisions) == 2


def test_a_revision_overtaken_before_it_verified_ends_superseded(
    admin: Client, dataset: str
) -> None:
    # Two revisions of one source in one batch: the first is overtaken at once.
    items = [
        {"dataset": dataset, "source_key": "race.md", "content": f"the race, take {n}"}
        for n in (1, 2)
    ]
    first, second = admin.ingest_many(items, wait="verified", timeout=60)
    assert isinstance(first, RevisionSuperseded), first
    assert first.code == "superseded"
    assert isinstance(second, Receipt), second
    assert first.details["revision_id"] != str(second.source_revision_id)


def test_ingest_many_goes_in_bounded_chunks_with_progress(admin: Client, dataset: str) -> None:
    items = [
        {
            "dataset": dataset,
            "source_key": f"notes/{n:03}.md",
            "content": f"note {n}: the wren sings at {n} past dawn",
            "tags": ["even" if n % 2 == 0 else "odd"],
            "metadata": {"n": n},
        }
        for n in range(25)
    ]
    items.append(
        {"dataset": dataset, "source_key": "bad", "content": "x", "media_type": "nonsense"}
    )
    seen: list[tuple[int, int]] = []
    results = admin.ingest_many(
        items,
        chunk_size=10,
        progress=lambda done, total: seen.append((done, total)),
        wait="verified",
    )
    assert seen == [(10, 26), (20, 26), (26, 26)]
    assert all(isinstance(r, Receipt) for r in results[:25]), results
    refused = results[25]
    assert not isinstance(refused, Receipt) and refused.status == 422, refused
    assert refused.code, refused
    page = admin.list_sources(dataset, prefix="notes/", limit=10)
    assert [s.source_key for s in page.sources] == [f"notes/{n:03}.md" for n in range(10)]
    assert page.next_after == "notes/009.md"
    # Filters and facets, over what was just verified.
    answer = admin.search(
        "wren sings",
        datasets=[dataset],
        mode="lexical",
        top_k=50,
        filter={"must": [{"field": "tags", "any": ["even"]}, {"field": "metadata.n", "lt": 10}]},
        facets=["tags"],
    )
    assert sorted(_keys(answer)) == [f"notes/{n:03}.md" for n in range(0, 10, 2)]
    (tags,) = answer.facets or []
    assert tags.field == "tags" and tags.exact
    assert {str(v.value): v.count for v in tags.values} == {"even": 5}
    counted = admin.facets(dataset, ["tags"])
    assert {str(v.value): v.count for v in counted.facets[0].values} == {"even": 13, "odd": 12}


def test_bytes_go_as_base64_and_come_back(admin: Client, dataset: str) -> None:
    text = "naïve café notes: the swift returns in May".encode()
    receipt = admin.put_source(dataset, "utf8.md", text, media_type="text/markdown")
    assert receipt.content_sha256 == hashlib.sha256(text).hexdigest()
    assert admin.revision_content(str(receipt.source_revision_id)) == text
    assert base64.b64encode(text)


def test_delete_is_a_tombstone_and_search_forgets_it(admin: Client, dataset: str) -> None:
    admin.ingest(dataset, "gone.md", "the corncrake calls from the meadow at night")
    assert _keys(admin.search("corncrake meadow", datasets=[dataset], mode="lexical")) == [
        "gone.md"
    ]
    tombstone = admin.delete_source(dataset, "gone.md", reason="test")
    assert tombstone.tombstone
    for mode in ("vector", "lexical", "auto"):
        assert _keys(admin.search("corncrake meadow", datasets=[dataset], mode=mode)) == []


def test_access_is_set_without_a_new_revision(admin: Client, dataset: str, base_url: str) -> None:
    receipt = admin.ingest(
        dataset, "hr.md", "the salary bands of the falconry team", readers=["user:alice"]
    )
    record = admin.get_access(dataset, "hr.md")
    assert record.readers == ["user:alice"]
    alice = token_for(admin, ["search", "ingest"], principal="user:alice")
    bob = token_for(admin, ["search", "ingest"], principal="user:bob")
    with Client(base_url, alice) as as_alice, Client(base_url, bob) as as_bob:
        query = {"datasets": [dataset], "mode": "lexical"}
        assert _keys(as_alice.search("salary falconry", **query)) == ["hr.md"]
        assert _keys(as_bob.search("salary falconry", **query)) == []
        changed = admin.set_access(dataset, "hr.md", ["user:alice", "user:bob"], reason="test")
        assert changed.version > record.version
        assert _keys(as_bob.search("salary falconry", **query)) == ["hr.md"]
    view = admin.get_source(dataset, "hr.md")
    assert [str(r.id) for r in view.revisions] == [str(receipt.source_revision_id)]


def test_tokens_the_feed_and_webhooks(admin: Client, dataset: str) -> None:
    created = admin.create_token("py-reader", ["search"], datasets=[dataset])
    assert created.token.name == "py-reader" and created.secret
    listed = {str(t.id) for t in admin.list_tokens().tokens}
    assert str(created.token.id) in listed
    revoked = admin.revoke_token(str(created.token.id), reason="test")
    assert revoked.token.state == "revoked"
    # The change feed: a new revision's events, after a cursor taken before it.
    start = admin.changes(0, datasets=[dataset], types=["generation.switched"]).next_after
    receipt = admin.ingest(dataset, "feed.md", "a curlew over the estuary at low tide")
    page = admin.changes(start, datasets=[dataset], types=["receipt.verified"], limit=100)
    mine = [e for e in page.events if e.revision_id == str(receipt.source_revision_id)]
    assert any(e.data.get("backend") == "all" for e in mine), page
    assert all(e.seq > start for e in page.events)
    # Webhooks: created with a secret shown once, paused, resumed, rotated, deleted.
    hook = admin.create_webhook(
        "https://hooks.example.com/cairn", events=["receipt.verified"], datasets=[dataset]
    )
    assert hook.secret.startswith("whsec_") and hook.webhook.state == "active"
    webhook_id = hook.webhook.id
    assert webhook_id in {w.webhook.id for w in admin.list_webhooks()}
    assert admin.pause_webhook(webhook_id, reason="test").webhook.state == "paused"
    assert admin.resume_webhook(webhook_id, reason="test").webhook.state == "active"
    rotated = admin.rotate_webhook_secret(webhook_id, reason="test")
    assert rotated.secret != hook.secret and rotated.webhook.previous_secret_until
    assert admin.delete_webhook(webhook_id, reason="test").webhook.state == "deleted"


def test_the_async_client_does_the_same(base_url: str, admin_token: str, dataset: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(base_url, admin_token) as client:
            first = await client.ingest(dataset, "a.md", "the swallow nests under the barn eaves")
            second = await client.ingest(dataset, "a.md", "the martin nests under the church eaves")
            answers = await asyncio.gather(
                *(
                    client.search("nests under eaves", datasets=[dataset], mode=mode)
                    for mode in ("vector", "lexical", "auto")
                )
            )
            for answer in answers:
                revisions = {str(hit.source_revision_id) for hit in answer.results}
                assert revisions == {str(second.source_revision_id)}, answer
            assert first.source_revision_id != second.source_revision_id
            detail = await client.revision(str(second.source_revision_id))
            assert all(r.state == "verified" for r in detail.receipts)
            results = await client.ingest_many(
                [
                    {"dataset": dataset, "source_key": f"b{n}.md", "content": f"b {n} swift"}
                    for n in range(5)
                ],
                chunk_size=2,
                wait="verified",
            )
            assert all(isinstance(r, Receipt) for r in results)

    asyncio.run(scenario())


def test_a_token_from_the_environment(
    base_url: str, admin_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAIRN_TOKEN", admin_token)
    with Client(base_url) as client:
        assert client.token_self()["name"]
    calls = []

    def provider() -> str:
        calls.append(1)
        return admin_token

    monkeypatch.delenv("CAIRN_TOKEN")
    with Client(base_url, token_provider=provider) as client:
        assert client.token_self()["scopes"]
        client.token_self()
    assert len(calls) == 2, "the provider is asked at every request"
    assert uuid.UUID(str(uuid.uuid4()))
