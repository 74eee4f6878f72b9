"""verify_webhook on real deliveries: cairn delivers to a receiver in this process, the
client's check accepts each, and refuses a changed body, a wrong secret and an old timestamp."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from cairn_client import Client, WebhookVerificationError, verify_webhook


class _Receiver(BaseHTTPRequestHandler):
    deliveries: ClassVar[list[tuple[dict[str, str], bytes]]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        _Receiver.deliveries.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_real_deliveries_verify_and_forgeries_do_not(admin: Client, dataset: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        hook = admin.create_webhook(url, events=["receipt.verified"], datasets=[dataset])
        receipt = admin.ingest(dataset, "hook.md", "a wagtail on the weir wall")
        revision = str(receipt.source_revision_id)
        deadline = time.monotonic() + 60
        mine: list[tuple[dict[str, str], bytes]] = []
        while time.monotonic() < deadline and not mine:
            mine = [d for d in _Receiver.deliveries if revision.encode() in d[1]]
            time.sleep(0.1)
        assert mine, "no delivery about the revision within 60 s"
        headers, body = mine[0]
        event = verify_webhook(headers, body, hook.secret)
        assert event.type == "receipt.verified" and event.revision_id == revision
        assert event.dataset == dataset and event.id == headers["webhook-id"]

        with pytest.raises(WebhookVerificationError) as e:
            verify_webhook(headers, body.replace(b"receipt", b"reciept"), hook.secret)
        assert e.value.code == "bad_signature"
        other = admin.create_webhook(url, events=["job.dead"], datasets=[dataset])
        with pytest.raises(WebhookVerificationError):
            verify_webhook(headers, body, other.secret)
        with pytest.raises(WebhookVerificationError) as e:
            verify_webhook(headers, body, hook.secret, now=time.time() + 3600)
        assert e.value.code == "stale_timestamp"
        missing = {k: v for k, v in headers.items() if k.lower() != "webhook-signature"}
        with pytest.raises(WebhookVerificationError) as e:
            verify_webhook(missing, body, hook.secret)
        assert e.value.code == "missing_header"
        admin.delete_webhook(hook.webhook.id, reason="test")
        admin.delete_webhook(other.webhook.id, reason="test")
    finally:
        server.shutdown()
