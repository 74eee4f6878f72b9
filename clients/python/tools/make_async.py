"""Writes the async client (aio.py) from the blocking one (client.py), word for word.

    python tools/make_async.py          # rewrites cairn-client/src/cairn_client/aio.py
    python tools/make_async.py --check  # exits 1 when aio.py is not what client.py makes

The two clients send the same calls (built in _operations.py) and wait the same way (the
generators in _core.py); this keeps the rest of them, the methods and their documentation,
from drifting apart: scripts/check-clients runs the check.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "cairn-client/src/cairn_client"

# Applied in order, each to the whole text.
RULES: list[tuple[str, str]] = [
    (
        r'"""The blocking client."""',
        '"""The async client, made from client.py by tools/make_async.py: do not edit."""',
    ),
    (r"^import time$", "import asyncio"),
    (r"class Client:", "class AsyncClient:"),
    (
        r"A blocking client of one cairn server\.",
        "An async client of one cairn server (``await`` every call).",
    ),
    (r"httpx\.BaseTransport", "httpx.AsyncBaseTransport"),
    (r"httpx\.Client\(", "httpx.AsyncClient("),
    (r"def __enter__\(self\) -> Client:", "async def __aenter__(self) -> AsyncClient:"),
    (
        r"def __exit__\(self, \*exc: object\) -> None:\n        self\.close\(\)",
        "async def __aexit__(self, *exc: object) -> None:\n        await self.aclose()",
    ),
    (r"def close\(self\) -> None:", "async def aclose(self) -> None:"),
    (r"self\._http\.close\(\)", "await self._http.aclose()"),
    (
        r"Use it as a context manager, or call :meth:`close`\.",
        "Use it as an async context manager, or call :meth:`aclose`.",
    ),
    (r"response = self\._http\.request\(", "response = await self._http.request("),
    (r"time\.sleep\(", "await asyncio.sleep("),
    (r"(?m)^(    )def (?!__)", r"\1async def "),
    (r"self\.(_send|_drive|_wait|_feed_cursor|put_source|put_sources)\(", r"await self.\1("),
]


def make(source: str) -> str:
    """The async module's text for the blocking module's text."""
    text = source
    for pattern, replacement in RULES:
        text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        if count == 0:
            raise SystemExit(f"make_async: rule {pattern!r} matched nothing in client.py")
    return text


def formatted(text: str) -> str:
    """``text`` as ``ruff format`` (beside this interpreter) lays it out."""
    ruff = Path(sys.executable).parent / "ruff"
    done = subprocess.run(
        [str(ruff), "format", "--stdin-filename", str(PACKAGE / "aio.py"), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def main() -> None:
    """Writes aio.py, or with ``--check`` compares it."""
    made = formatted(make((PACKAGE / "client.py").read_text(encoding="utf-8")))
    target = PACKAGE / "aio.py"
    if "--check" in sys.argv[1:]:
        if target.read_text(encoding="utf-8") != made:
            sys.stderr.write("aio.py differs from what client.py makes: run tools/make_async.py\n")
            raise SystemExit(1)
        return
    target.write_text(made, encoding="utf-8")


if __name__ == "__main__":
    main()
