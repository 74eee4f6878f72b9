"""Every operation of the client as a :class:`~._core.Call`.

Each names the path, the query, the body, and the model its answer becomes. Both clients
send exactly these.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from . import _generated as gen
from ._core import SETTLING_EVENTS, Call, Params
from .errors import CairnError, error_from_response
from .models import ChangePage, CreatedWebhook, Receipt, WebhookChanged, WebhookSummary

M = TypeVar("M", bound=BaseModel)

#: A source for a put: ``content`` (text or bytes) and the optional fields of the API.
SourceInput = Mapping[str, Any]


def model(kind: type[M]) -> Callable[[httpx.Response], M]:
    """Reads an answer's JSON body as ``kind``."""
    return lambda response: kind.model_validate(response.json())


def _json(response: httpx.Response) -> Any:
    return response.json()


def _key(text: str) -> str:
    return quote(text, safe="")


def source_body(
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
) -> dict[str, Any]:
    """A put's body: text as ``content``, bytes as ``content_base64``."""
    body: dict[str, Any] = {"dataset": dataset, "source_key": source_key}
    if isinstance(content, bytes):
        body["content_base64"] = base64.b64encode(content).decode("ascii")
    else:
        body["content"] = content
    optional: dict[str, Any] = {
        "media_type": media_type,
        "tags": list(tags) if tags is not None else None,
        "metadata": dict(metadata) if metadata is not None else None,
        "valid_from": valid_from,
        "valid_to": valid_to,
        "access": {"readers": list(readers)} if readers is not None else None,
    }
    body.update({name: value for name, value in optional.items() if value is not None})
    return body


def item_body(item: SourceInput) -> dict[str, Any]:
    """A batch item from a mapping with the same names as :func:`source_body`'s arguments."""
    fields = dict(item)
    try:
        dataset, source_key, content = (
            fields.pop("dataset"),
            fields.pop("source_key"),
            fields.pop("content"),
        )
    except KeyError as missing:
        raise ValueError(
            f"a source needs dataset, source_key and content: {missing} is missing"
        ) from None
    return source_body(dataset, source_key, content, **fields)


def item_weight(item: SourceInput) -> int:
    """About how many bytes an item adds to a batch's body."""
    content = item.get("content", "")
    size = len(content) if isinstance(content, bytes | str) else 0
    return (size * 4) // 3 + 512


def put_source(body: dict[str, Any]) -> Call[Receipt]:
    """``POST /v1/sources``."""
    return Call("POST", "/v1/sources", model(Receipt), body=body)


def _batch_results(response: httpx.Response) -> list[Receipt | CairnError]:
    results: list[Receipt | CairnError] = []
    for entry in response.json().get("results", []):
        if entry.get("accepted") is False:
            status = int(entry.get("http_status", 422))
            results.append(error_from_response(status, json.dumps(entry).encode(), None))
        else:
            results.append(Receipt.model_validate(entry))
    return results


def put_batch(items: Sequence[dict[str, Any]]) -> Call[list[Receipt | CairnError]]:
    """``POST /v1/sources/batch``: a receipt or an error per item, in order."""
    return Call("POST", "/v1/sources/batch", _batch_results, body={"items": list(items)})


def delete_source(
    dataset: str, source_key: str, reason: str | None, valid_from: int | str | None
) -> Call[Receipt]:
    """``DELETE /v1/sources``: a tombstone, as a new revision."""
    params = {"dataset": dataset, "source_key": source_key, "reason": reason}
    params["valid_from"] = None if valid_from is None else str(valid_from)
    return Call("DELETE", "/v1/sources", model(Receipt), params=params)


def erase_source(dataset: str, source_key: str, reason: str) -> Call[dict[str, Any]]:
    """``DELETE /v1/sources?erase=true``: every revision's bytes and traces removed."""
    params: Params = {"dataset": dataset, "source_key": source_key, "reason": reason, "erase": True}
    return Call("DELETE", "/v1/sources", _json, params=params)


def get_source(dataset: str, source_key: str) -> Call[gen.SourceView]:
    """``GET /v1/sources``."""
    params = {"dataset": dataset, "source_key": source_key}
    return Call("GET", "/v1/sources", model(gen.SourceView), params=params, idempotent=True)


def list_sources(
    dataset: str, prefix: str | None, after: str | None, limit: int | None
) -> Call[gen.SourcePage]:
    """``GET /v1/datasets/{dataset}/sources``."""
    params = {"prefix": prefix, "after": after, "limit": limit}
    path = f"/v1/datasets/{_key(dataset)}/sources"
    return Call("GET", path, model(gen.SourcePage), params=params, idempotent=True)


def revision(revision_id: str) -> Call[gen.RevisionDetail]:
    """``GET /v1/revisions/{id}``."""
    path = f"/v1/revisions/{_key(revision_id)}"
    return Call("GET", path, model(gen.RevisionDetail), idempotent=True)


def revision_raw(revision_id: str) -> Call[Any]:
    """``GET /v1/revisions/{id}`` as plain JSON (what a wait reads)."""
    return Call("GET", f"/v1/revisions/{_key(revision_id)}", _json, idempotent=True)


def revision_content(revision_id: str) -> Call[bytes]:
    """``GET /v1/revisions/{id}/content``: the retained bytes."""
    path = f"/v1/revisions/{_key(revision_id)}/content"
    return Call("GET", path, lambda response: response.content, idempotent=True)


def get_access(dataset: str, source_key: str) -> Call[gen.AccessRecord]:
    """``GET /v1/sources/access``."""
    params = {"dataset": dataset, "source_key": source_key}
    path = "/v1/sources/access"
    return Call("GET", path, model(gen.AccessRecord), params=params, idempotent=True)


def set_access(
    dataset: str, source_key: str, readers: Sequence[str] | None, reason: str | None
) -> Call[gen.AccessRecord]:
    """``PUT /v1/sources/access``: not a new revision."""
    body: dict[str, Any] = {
        "dataset": dataset,
        "source_key": source_key,
        "readers": None if readers is None else list(readers),
    }
    if reason is not None:
        body["reason"] = reason
    return Call("PUT", "/v1/sources/access", model(gen.AccessRecord), body=body, idempotent=True)


def search(body: dict[str, Any]) -> Call[gen.SearchResponse]:
    """``POST /v1/search`` (a read: retried when cut off)."""
    return Call("POST", "/v1/search", model(gen.SearchResponse), body=body, idempotent=True)


def search_body(
    query: str,
    *,
    datasets: Sequence[str] | None = None,
    top_k: int | None = None,
    mode: str | None = None,
    filter: Mapping[str, Any] | None = None,
    facets: Sequence[str] | None = None,
    facet_values: int | None = None,
    valid_at: int | str | None = None,
    as_of: int | str | None = None,
    budget_ms: int | None = None,
    group_by_source: bool | None = None,
    expand: str | None = None,
) -> dict[str, Any]:
    """A search's body, without the fields left out."""
    fields: dict[str, Any] = {
        "query": query,
        "datasets": list(datasets) if datasets is not None else None,
        "top_k": top_k,
        "mode": mode,
        "filter": dict(filter) if filter is not None else None,
        "facets": list(facets) if facets is not None else None,
        "facet_values": facet_values,
        "valid_at": valid_at,
        "as_of": as_of,
        "budget_ms": budget_ms,
        "group_by_source": group_by_source,
        "expand": expand,
    }
    return {name: value for name, value in fields.items() if value is not None}


def facets(
    dataset: str,
    fields: Sequence[str],
    filter: Mapping[str, Any] | None,
    values: int | None,
) -> Call[gen.FacetAnswer]:
    """``GET /v1/datasets/{dataset}/facets``."""
    params = {
        "field": ",".join(fields),
        "filter": None if filter is None else json.dumps(filter),
        "values": values,
    }
    path = f"/v1/datasets/{_key(dataset)}/facets"
    return Call("GET", path, model(gen.FacetAnswer), params=params, idempotent=True)


def changes(
    after: int,
    datasets: Sequence[str] | None,
    types: Sequence[str] | None,
    limit: int | None,
    wait_ms: int | None,
) -> Call[ChangePage]:
    """``GET /v1/changes``."""
    params = {
        "after": after,
        "datasets": None if datasets is None else ",".join(datasets),
        "types": None if types is None else ",".join(types),
        "limit": limit,
        "wait_ms": wait_ms,
    }
    return Call("GET", "/v1/changes", model(ChangePage), params=params, idempotent=True)


def feed_head(dataset: str) -> Call[int]:
    """The newest event's number: a read of the feed that matches nothing moves to it."""
    params: Params = {"after": 0, "datasets": dataset, "types": "generation.switched", "limit": 1}
    return Call(
        "GET",
        "/v1/changes",
        lambda response: int(response.json().get("next_after", 0)),
        params=params,
        idempotent=True,
    )


def settling_changes(cursor: int, dataset: str | None, wait_ms: int) -> Call[Any]:
    """The feed's events that can settle a wait, after ``cursor``, long-polled."""
    params = {
        "after": cursor,
        "datasets": dataset,
        "types": SETTLING_EVENTS,
        "limit": 1000,
        "wait_ms": wait_ms,
    }
    return Call("GET", "/v1/changes", _json, params=params, idempotent=True)


# -- tokens ---------------------------------------------------------------------------------


def token_self() -> Call[dict[str, Any]]:
    """``GET /v1/tokens/self``."""
    return Call("GET", "/v1/tokens/self", _json, idempotent=True)


def list_tokens() -> Call[gen.TokenList]:
    """``GET /v1/tokens``."""
    return Call("GET", "/v1/tokens", model(gen.TokenList), idempotent=True)


def create_token(body: dict[str, Any]) -> Call[gen.TokenAnswer]:
    """``POST /v1/tokens``: the secret is in the answer, once."""
    return Call("POST", "/v1/tokens", model(gen.TokenAnswer), body=body)


def revoke_token(token_id: str, reason: str | None) -> Call[gen.TokenAnswer]:
    """``POST /v1/tokens/{id}/revoke``."""
    body = {} if reason is None else {"reason": reason}
    path = f"/v1/tokens/{_key(token_id)}/revoke"
    return Call("POST", path, model(gen.TokenAnswer), body=body, idempotent=True)


def rotate_token(token_id: str, reason: str | None) -> Call[gen.TokenAnswer]:
    """``POST /v1/tokens/{id}/rotate``."""
    body = {} if reason is None else {"reason": reason}
    return Call("POST", f"/v1/tokens/{_key(token_id)}/rotate", model(gen.TokenAnswer), body=body)


# -- connectors -----------------------------------------------------------------------------


def list_connectors() -> Call[gen.ConnectorList]:
    """``GET /v1/connectors``."""
    return Call("GET", "/v1/connectors", model(gen.ConnectorList), idempotent=True)


def get_connector(connector_id: str) -> Call[gen.ConnectorView]:
    """``GET /v1/connectors/{id}``."""
    path = f"/v1/connectors/{_key(connector_id)}"
    return Call("GET", path, model(gen.ConnectorView), idempotent=True)


def create_connector(body: dict[str, Any]) -> Call[dict[str, Any]]:
    """``POST /v1/connectors``: the connector and its first run."""
    return Call("POST", "/v1/connectors", _json, body=body)


def connector_action(connector_id: str, action: str, reason: str | None) -> Call[dict[str, Any]]:
    """``POST /v1/connectors/{id}/{run|pause|resume}``."""
    path = f"/v1/connectors/{_key(connector_id)}/{action}"
    return Call("POST", path, _json, params={"reason": reason}, idempotent=True)


def delete_connector(
    connector_id: str, reason: str, tombstone: bool | None
) -> Call[dict[str, Any]]:
    """``DELETE /v1/connectors/{id}``."""
    params = {"reason": reason, "tombstone": tombstone}
    path = f"/v1/connectors/{_key(connector_id)}"
    return Call("DELETE", path, _json, params=params, idempotent=True)


# -- webhooks -------------------------------------------------------------------------------


def create_webhook(body: dict[str, Any]) -> Call[CreatedWebhook]:
    """``POST /v1/webhooks``: the secret is in the answer, once."""
    return Call("POST", "/v1/webhooks", model(CreatedWebhook), body=body)


def list_webhooks() -> Call[list[WebhookSummary]]:
    """``GET /v1/webhooks``: each with its deliveries counted."""
    return Call(
        "GET",
        "/v1/webhooks",
        lambda response: [WebhookSummary.model_validate(w) for w in response.json()["webhooks"]],
        idempotent=True,
    )


def get_webhook(webhook_id: str) -> Call[dict[str, Any]]:
    """``GET /v1/webhooks/{id}``: the webhook, its deliveries counted, its history."""
    return Call("GET", f"/v1/webhooks/{_key(webhook_id)}", _json, idempotent=True)


def webhook_action(webhook_id: str, action: str, reason: str | None) -> Call[WebhookChanged]:
    """``POST /v1/webhooks/{id}/{pause|resume}``."""
    path = f"/v1/webhooks/{_key(webhook_id)}/{action}"
    return Call("POST", path, model(WebhookChanged), params={"reason": reason}, idempotent=True)


def rotate_webhook_secret(webhook_id: str, reason: str | None) -> Call[CreatedWebhook]:
    """``POST /v1/webhooks/{id}/rotate-secret``: the new secret, once."""
    path = f"/v1/webhooks/{_key(webhook_id)}/rotate-secret"
    return Call("POST", path, model(CreatedWebhook), params={"reason": reason})


def delete_webhook(webhook_id: str, reason: str | None) -> Call[WebhookChanged]:
    """``DELETE /v1/webhooks/{id}``."""
    path = f"/v1/webhooks/{_key(webhook_id)}"
    return Call("DELETE", path, model(WebhookChanged), params={"reason": reason}, idempotent=True)


def healthz() -> Call[bool]:
    """``GET /healthz``."""
    return Call("GET", "/healthz", lambda response: True, idempotent=True)
