"""A webhook receiver that verifies every delivery with the reference Standard Webhooks
library (PyPI `standardwebhooks`, pinned by scripts/setup-webhooks). Run by
events/tests/webhooks.rs:

    receiver.py PORT NAME=SECRET [NAME=SECRET ...]

Serves POST /NAME on 127.0.0.1:PORT: a delivery that verifies under NAME's secret is answered
204, one that does not 401; GET /log answers every delivery seen as JSON lines
(path, id, verified, body). Prints `listening` once it accepts connections.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

PORT = int(sys.argv[1])
VERIFIERS = {name: Webhook(secret) for name, secret in (arg.split("=", 1) for arg in sys.argv[2:])}
SEEN = []


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        verifier = VERIFIERS.get(self.path.strip("/"))
        verified = False
        if verifier is not None:
            try:
                verifier.verify(body, dict(self.headers.items()))
                verified = True
            except WebhookVerificationError:
                verified = False
        SEEN.append({"path": self.path, "id": self.headers.get("webhook-id"),
                     "verified": verified, "body": body.decode("utf-8", "replace")})
        self.send_response(204 if verified else 401)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self):
        answer = "".join(json.dumps(item) + "\n" for item in SEEN).encode()
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print("listening", flush=True)
server.serve_forever()
