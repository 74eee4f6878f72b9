"""The async client, made from client.py by tools/make_async.py: do not edit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Literal, TypeVar

import httpx

from . import _core as core
from . import _generated as gen
from . import _operations as ops
from .errors import CairnError
from .models import (
    ChangePage,
    CreatedWebhook,
    Receipt,
    SearchAnswer,
    WebhookChanged,
    WebhookSummary,
)

T = TypeVar("T")

Wait = Literal["accepted", "verified"]


class AsyncClient:
    """An async client of one cairn server (``await`` every call).

    ``token`` is the bearer token; without it, ``token_provider()`` is asked at each request
    (an OAuth access token source, say), else ``CAIRN_TOKEN`` is read. Answers 429 and 503 are
    retried as ``retry`` says; every other error raises its :mod:`cairn_client.errors` class.
    Use it as an async context manager, or call :meth:`aclose`.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        token: str | None = None,
        *,
        token_provider: core.TokenProvider | None = None,
        timeout: float = 30.0,
        retry: core.Retry | None = None,
        on_retry: core.RetryHook | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._token = token
        self._provider = token_provider
        self._retry = retry or core.Retry()
        self._on_retry = on_retry
        # A long poll of the change feed waits up to 20 s on the server: reads get that more.
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            timeout=httpx.Timeout(timeout, read=timeout + core.FEED_WAIT_MS / 1000),
            transport=transport,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the connections."""
        await self._http.aclose()

    # -- the one way out ---------------------------------------------------------------------

    async def _send(self, call: core.Call[T]) -> T:
        attempt, waited = 0, 0.0
        while True:
            attempt += 1
            try:
                response = await self._http.request(
                    call.method,
                    call.path,
                    params=core.query(call.params),
                    json=call.body,
                    headers=core.headers(core.bearer(self._token, self._provider)),
                )
            except httpx.HTTPError as failure:
                error: CairnError = core.transport_error(failure)
            else:
                try:
                    return core.outcome(call, response)
                except CairnError as answered:
                    error = answered
            pause = self._retry.pause(attempt, error, waited, call.idempotent)
            if pause is None:
                raise error
            if self._on_retry is not None:
                self._on_retry(error, pause)
            await asyncio.sleep(pause)
            waited += pause

    async def _drive(self, steps: Generator[core.Call[Any] | core.Sleep, Any, T]) -> T:
        try:
            step = next(steps)
            while True:
                if isinstance(step, core.Sleep):
                    await asyncio.sleep(step.seconds)
                    step = steps.send(None)
                    continue
                try:
                    value = await self._send(step)
                except CairnError as error:
                    step = steps.throw(error)
                else:
                    step = steps.send(value)
        except StopIteration as done:
            result: T = done.value
            return result

    # -- sources -----------------------------------------------------------------------------

    async def put_source(
        self,
        dataset: str,
        source_key: str,
        content: str | bytes,
        *,
        media_type: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        valid_from: int | str | None = None,
        valid_to: int | str | None = None,
        readers: Sequence[str] | None = None,
    ) -> Receipt:
        """Puts a revision of a source: the receipt says its bytes are durable, not indexed.

        Text goes as ``content``, bytes (a PDF, say, with its ``media_type``) as base64.
        """
        body = ops.source_body(
            dataset,
            source_key,
            content,
            media_type=media_type,
            tags=tags,
            metadata=metadata,
            valid_from=valid_from,
            valid_to=valid_to,
            readers=readers,
        )
        return await self._send(ops.put_source(body))

    async def put_sources(self, items: Sequence[ops.SourceInput]) -> list[Receipt | CairnError]:
        """Puts up to 1,000 sources in one batch: a receipt or an error per item, in order.

        Each item is a mapping with :meth:`put_source`'s argument names.
        """
        return await self._send(ops.put_batch([ops.item_body(item) for item in items]))

    async def ingest(
        self,
        dataset: str,
        source_key: str,
        content: str | bytes,
        *,
        wait: Wait = "verified",
        timeout: float = 60.0,
        **fields: Any,
    ) -> Receipt:
        """Puts a revision, then follows its receipt until every store verified it.

        ``wait="accepted"`` returns at the receipt. Raises :class:`~.errors.WaitTimeout` when
        ``timeout`` seconds pass first (the revision stays accepted),
        :class:`~.errors.RevisionSuperseded` when a newer revision overtook it, and
        :class:`~.errors.ProjectionFailed` when its projection failed for good. Follows the
        change feed where the token may read it, and polls with backoff where it may not.
        """
        cursor = await self._feed_cursor(dataset) if wait == "verified" else None
        receipt = await self.put_source(dataset, source_key, content, **fields)
        if wait == "verified":
            ended = await self._wait([str(receipt.source_revision_id)], dataset, cursor, timeout)
            error = ended.get(str(receipt.source_revision_id))
            if error is not None:
                raise error
        return receipt

    async def ingest_many(
        self,
        items: Sequence[ops.SourceInput],
        *,
        chunk_size: int = 500,
        max_chunk_bytes: int = 8 << 20,
        progress: Callable[[int, int], None] | None = None,
        wait: Wait = "accepted",
        timeout: float = 300.0,
    ) -> list[Receipt | CairnError]:
        """Puts many sources through the batch endpoint, in bounded chunks, in order.

        Answers a receipt or an error per item. ``progress(done, total)`` is called after
        each chunk. With ``wait="verified"``, an accepted item's entry becomes the error that
        ended its projection otherwise (superseded, failed) once all are settled.
        """
        chunks = core.chunks(
            list(items), max(1, min(chunk_size, 1000)), max_chunk_bytes, ops.item_weight
        )
        datasets = {str(item.get("dataset")) for item in items}
        dataset = next(iter(datasets)) if len(datasets) == 1 else None
        cursor = await self._feed_cursor(dataset) if wait == "verified" and dataset else None
        results: list[Receipt | CairnError] = []
        for chunk in chunks:
            results.extend(await self.put_sources(chunk))
            if progress is not None:
                progress(len(results), len(items))
        if wait == "verified":
            revisions = [str(r.source_revision_id) for r in results if isinstance(r, Receipt)]
            ended = await self._wait(revisions, dataset, cursor, timeout)
            results = [
                (ended.get(str(r.source_revision_id)) or r) if isinstance(r, Receipt) else r
                for r in results
            ]
        return results

    async def _feed_cursor(self, dataset: str | None) -> int | None:
        if dataset is None:
            return None
        try:
            return await self._send(ops.feed_head(dataset))
        except CairnError:
            return None

    async def _wait(
        self, revisions: list[str], dataset: str | None, cursor: int | None, timeout: float
    ) -> dict[str, CairnError | None]:
        return await self._drive(
            core.follow(revisions, dataset, cursor, timeout, ops.revision_raw, ops.settling_changes)
        )

    async def delete_source(
        self,
        dataset: str,
        source_key: str,
        *,
        reason: str | None = None,
        valid_from: int | str | None = None,
    ) -> Receipt:
        """Deletes a source: a tombstone revision, after which search never returns it."""
        return await self._send(ops.delete_source(dataset, source_key, reason, valid_from))

    async def erase_source(self, dataset: str, source_key: str, *, reason: str) -> dict[str, Any]:
        """Erases every revision of a source (scope ``erase``): the erasure's receipt."""
        return await self._send(ops.erase_source(dataset, source_key, reason))

    async def get_source(self, dataset: str, source_key: str) -> gen.SourceView:
        """A source: its head, its revisions and its head moves."""
        return await self._send(ops.get_source(dataset, source_key))

    async def list_sources(
        self,
        dataset: str,
        *,
        prefix: str | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> gen.SourcePage:
        """A page of a dataset's heads by key; pass ``next_after`` as ``after`` for the next."""
        return await self._send(ops.list_sources(dataset, prefix, after, limit))

    async def revision(self, revision_id: str) -> gen.RevisionDetail:
        """A revision with its job, its receipts per store and its history."""
        return await self._send(ops.revision(revision_id))

    async def revision_content(self, revision_id: str) -> bytes:
        """A revision's retained bytes."""
        return await self._send(ops.revision_content(revision_id))

    async def get_access(self, dataset: str, source_key: str) -> gen.AccessRecord:
        """Who may read a source."""
        return await self._send(ops.get_access(dataset, source_key))

    async def set_access(
        self,
        dataset: str,
        source_key: str,
        readers: Sequence[str] | None,
        *,
        reason: str | None = None,
    ) -> gen.AccessRecord:
        """Sets who may read a source (``None``: its dataset's default); not a new revision."""
        return await self._send(ops.set_access(dataset, source_key, readers, reason))

    # -- search ------------------------------------------------------------------------------

    async def search(self, query: str, **options: Any) -> SearchAnswer:
        """Searches: every hit is bound to its source's current revision.

        Options are the API's: ``datasets``, ``top_k``, ``mode`` (``auto``, ``vector``,
        ``lexical``), ``filter``, ``facets``, ``facet_values``, ``valid_at``, ``as_of``,
        ``budget_ms``, ``group_by_source``, ``expand``.
        """
        return await self._send(ops.search(ops.search_body(query, **options)))

    async def facets(
        self,
        dataset: str,
        fields: Sequence[str],
        *,
        filter: Mapping[str, Any] | None = None,
        values: int | None = None,
    ) -> gen.FacetAnswer:
        """Counts of each field's values over a dataset's current sources, exact."""
        return await self._send(ops.facets(dataset, fields, filter, values))

    # -- the change feed ---------------------------------------------------------------------

    async def changes(
        self,
        after: int = 0,
        *,
        datasets: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
        limit: int | None = None,
        wait_ms: int | None = None,
    ) -> ChangePage:
        """A page of events after ``after``; keep ``next_after`` for the next call."""
        return await self._send(ops.changes(after, datasets, types, limit, wait_ms))

    # -- tokens ------------------------------------------------------------------------------

    async def token_self(self) -> dict[str, Any]:
        """The request's own token: name, scopes, datasets."""
        return await self._send(ops.token_self())

    async def list_tokens(self) -> gen.TokenList:
        """Every token (``admin``), never a secret."""
        return await self._send(ops.list_tokens())

    async def create_token(
        self,
        name: str,
        scopes: Sequence[str],
        *,
        datasets: Sequence[str] | None = None,
        expires_in_seconds: int | None = None,
        principal: str | None = None,
        groups: Sequence[str] | None = None,
    ) -> gen.TokenAnswer:
        """Creates a token (``admin``); its secret is in the answer, this once."""
        fields: dict[str, Any] = {
            "name": name,
            "scopes": list(scopes),
            "datasets": None if datasets is None else list(datasets),
            "expires_in_seconds": expires_in_seconds,
            "principal": principal,
            "groups": None if groups is None else list(groups),
        }
        body = {key: value for key, value in fields.items() if value is not None}
        return await self._send(ops.create_token(body))

    async def revoke_token(self, token_id: str, *, reason: str | None = None) -> gen.TokenAnswer:
        """Revokes a token: it stops working at the next request."""
        return await self._send(ops.revoke_token(token_id, reason))

    async def rotate_token(self, token_id: str, *, reason: str | None = None) -> gen.TokenAnswer:
        """A new secret for a token; the old one stops."""
        return await self._send(ops.rotate_token(token_id, reason))

    # -- connectors --------------------------------------------------------------------------

    async def list_connectors(self) -> gen.ConnectorList:
        """Connectors of the datasets the token may read, newest first."""
        return await self._send(ops.list_connectors())

    async def get_connector(self, connector_id: str) -> gen.ConnectorView:
        """A connector, its latest runs and its history."""
        return await self._send(ops.get_connector(connector_id))

    async def create_connector(
        self, dataset: str, kind: str, location: str, **fields: Any
    ) -> dict[str, Any]:
        """Adds a connector (``folder`` or ``git``) and its first run, due now."""
        body = {"dataset": dataset, "kind": kind, "location": location, **fields}
        return await self._send(ops.create_connector(body))

    async def run_connector(
        self, connector_id: str, *, reason: str | None = None
    ) -> dict[str, Any]:
        """Makes a connector's next run due now."""
        return await self._send(ops.connector_action(connector_id, "run", reason))

    async def pause_connector(
        self, connector_id: str, *, reason: str | None = None
    ) -> dict[str, Any]:
        """Pauses a connector."""
        return await self._send(ops.connector_action(connector_id, "pause", reason))

    async def resume_connector(
        self, connector_id: str, *, reason: str | None = None
    ) -> dict[str, Any]:
        """Resumes a connector: a run is queued now."""
        return await self._send(ops.connector_action(connector_id, "resume", reason))

    async def delete_connector(
        self, connector_id: str, *, reason: str, tombstone: bool | None = None
    ) -> dict[str, Any]:
        """Removes a connector; ``tombstone=True`` deletes the sources it created."""
        return await self._send(ops.delete_connector(connector_id, reason, tombstone))

    # -- webhooks ----------------------------------------------------------------------------

    async def create_webhook(
        self,
        url: str,
        *,
        events: Sequence[str] | None = None,
        datasets: Sequence[str] | None = None,
        description: str | None = None,
        reason: str | None = None,
    ) -> CreatedWebhook:
        """Subscribes a URL to events; the signing secret is in the answer, this once."""
        fields: dict[str, Any] = {
            "url": url,
            "events": None if events is None else list(events),
            "datasets": None if datasets is None else list(datasets),
            "description": description,
            "reason": reason,
        }
        body = {key: value for key, value in fields.items() if value is not None}
        return await self._send(ops.create_webhook(body))

    async def list_webhooks(self) -> list[WebhookSummary]:
        """Every webhook the token may read, deleted ones too, with deliveries counted."""
        return await self._send(ops.list_webhooks())

    async def get_webhook(self, webhook_id: str) -> dict[str, Any]:
        """A webhook, its deliveries counted by state, and its history."""
        return await self._send(ops.get_webhook(webhook_id))

    async def pause_webhook(self, webhook_id: str, *, reason: str | None = None) -> WebhookChanged:
        """Pauses deliveries; events wait in the outbox."""
        return await self._send(ops.webhook_action(webhook_id, "pause", reason))

    async def resume_webhook(self, webhook_id: str, *, reason: str | None = None) -> WebhookChanged:
        """Resumes deliveries."""
        return await self._send(ops.webhook_action(webhook_id, "resume", reason))

    async def rotate_webhook_secret(
        self, webhook_id: str, *, reason: str | None = None
    ) -> CreatedWebhook:
        """A new signing secret, shown this once; the old one signs beside it for a while."""
        return await self._send(ops.rotate_webhook_secret(webhook_id, reason))

    async def delete_webhook(self, webhook_id: str, *, reason: str | None = None) -> WebhookChanged:
        """Deletes a webhook: nothing more is delivered."""
        return await self._send(ops.delete_webhook(webhook_id, reason))

    async def healthz(self) -> bool:
        """Whether the server is alive."""
        return await self._send(ops.healthz())
