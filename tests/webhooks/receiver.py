"""A webhook receiver that verifies every delivery with the reference Standard Webhooks
library (PyPI `standardwebhooks`, pinned by scripts/setup-webhooks). Run by
events/tests/webhooks.rs:

    receiver.py PORT NAME=SECRET[,MODE=VALUE...] [NAME=SECRET ...]

Serves POST /NAME on 127.0.0.1:PORT: a delivery that verifies under NAME's secret is answered
204, one that does not 401; GET /log answers every delivery seen as JSON lines
(path, id, verified, status, at, body). Prints `listening` once it accepts connections.

A receiver can misbehave on purpose (a fault injected for the tests of retries), by mode:
- `fail_for=S`: answer 500 for S seconds after its first delivery, then as usual;
- `delay=S`: wait S seconds before answering;
- `hang=1`: never answer (the connection stays open);
- `gone=1`: answer 410 Gone.
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

PORT = int(sys.argv[1])
VERIFIERS = {}
MODES = {}
for arg in sys.argv[2:]:
    name, rest = arg.split("=", 1)
    secret, *modes = rest.split(",")
    VERIFIERS[name] = Webhook(secret)
    MODES[name] = dict(mode.split("=", 1) for mode in modes)
SEEN = []
FIRST = {}
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        name = self.path.strip("/")
        verifier = VERIFIERS.get(name)
        modes = MODES.get(name, {})
        verified = False
        if verifier is not None:
            try:
                verifier.verify(body, dict(self.headers.items()))
                verified = True
            except WebhookVerificationError:
                verified = False
        now = time.time()
        with LOCK:
            first = FIRST.setdefault(name, now)
        status = 204 if verified else 401
        if verified and "fail_for" in modes and now - first < float(modes["fail_for"]):
            status = 500
        if verified and modes.get("gone") == "1":
            status = 410
        if modes.get("hang") == "1":
            with LOCK:
                SEEN.append({"path": self.path, "id": self.headers.get("webhook-id"),
                             "verified": verified, "status": None, "at": now,
                             "body": body.decode("utf-8", "replace")})
            time.sleep(3600)
            return
        if "delay" in modes:
            time.sleep(float(modes["delay"]))
        with LOCK:
            SEEN.append({"path": self.path, "id": self.headers.get("webhook-id"),
                         "verified": verified, "status": status, "at": now,
                         "body": body.decode("utf-8", "replace")})
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self):
        with LOCK:
            answer = "".join(json.dumps(item) + "\n" for item in SEEN).encode()
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


ThreadingHTTPServer.daemon_threads = True
server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print("listening", flush=True)
server.serve_forever()
