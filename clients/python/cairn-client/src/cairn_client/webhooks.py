"""Checking a webhook delivery: the Standard Webhooks signature cairn sends.

cairn signs ``{webhook-id}.{webhook-timestamp}.{body}`` with HMAC-SHA256 under the secret it
showed once (``whsec_`` and base64), and sends ``v1,<base64>`` in ``webhook-signature``: two,
space-separated, while a rotated secret's grace lasts. :func:`verify_webhook` checks one of
them in constant time and refuses a timestamp too far from now, so that a captured delivery
cannot be replayed later.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from .errors import CairnError
from .models import Event


class WebhookVerificationError(CairnError):
    """A delivery whose signature, timestamp or headers do not check out: refuse it."""


#: How far a delivery's timestamp may be from now, in seconds (the reference library's).
TOLERANCE = 300


def _key(secret: str) -> bytes:
    encoded = secret.removeprefix("whsec_")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret is `whsec_` and base64, as cairn showed it") from None


def sign(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,`` signature of a delivery (what cairn sends; useful to test a receiver)."""
    message = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), message, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify_webhook(
    headers: Mapping[str, str],
    body: bytes | str,
    secret: str,
    *,
    tolerance: int = TOLERANCE,
    now: float | None = None,
) -> Event:
    """Checks a delivery and answers its event; raises :class:`WebhookVerificationError`.

    ``headers`` are the request's (any case); ``body`` the raw bytes as received, before any
    JSON parsing. Deliveries are at least once: deduplicate by the event's ``id``.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    raw = body.encode() if isinstance(body, str) else body
    try:
        webhook_id = lowered["webhook-id"]
        timestamp_text = lowered["webhook-timestamp"]
        signatures = lowered["webhook-signature"]
    except KeyError as missing:
        raise WebhookVerificationError("missing_header", f"no {missing.args[0]} header") from None
    try:
        timestamp = int(timestamp_text)
    except ValueError:
        raise WebhookVerificationError(
            "bad_timestamp", "webhook-timestamp is not an integer"
        ) from None
    clock = time.time() if now is None else now
    if abs(clock - timestamp) > tolerance:
        raise WebhookVerificationError(
            "stale_timestamp", f"webhook-timestamp is more than {tolerance} s from now"
        )
    expected = sign(secret, webhook_id, timestamp, raw)
    if not any(
        hmac.compare_digest(candidate, expected) for candidate in signatures.split(" ") if candidate
    ):
        raise WebhookVerificationError("bad_signature", "no signature matches the secret")
    try:
        parsed: Any = json.loads(raw)
    except ValueError:
        raise WebhookVerificationError("bad_body", "the body is not JSON") from None
    event = Event.model_validate(parsed)
    if event.id != webhook_id:
        raise WebhookVerificationError("id_mismatch", "webhook-id is not the event's id")
    return event
