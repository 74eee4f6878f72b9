"""The models follow the OpenAPI document the running server serves: the generated module
must be exactly what the generator makes of it, and the answers the client models by hand
must still be untyped there (so that they move to the generated module when they are not)."""

from __future__ import annotations

import difflib
import importlib.util
import inspect
from pathlib import Path
from typing import Any

import httpx
import pytest
from cairn_client import _generated

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("generate_models", TOOLS / "generate_models.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def document(base_url: str) -> dict[str, Any]:
    response = httpx.get(f"{base_url}/openapi.json", timeout=30)
    response.raise_for_status()
    return response.json()


def test_the_generated_models_are_the_served_documents(document: dict[str, Any]) -> None:
    made = _generator().generate(document)
    have = inspect.getsource(_generated)
    if made != have:
        diff = "".join(
            difflib.unified_diff(
                have.splitlines(True), made.splitlines(True), "_generated.py", "served", n=1
            )
        )
        pytest.fail(
            "cairn_client's models drifted from the served OpenAPI document; regenerate with "
            "`python tools/generate_models.py openapi.json > "
            "cairn-client/src/cairn_client/_generated.py`:\n" + diff[:6000]
        )


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("get", "/v1/changes", "200"),
        ("post", "/v1/webhooks", "201"),
        ("get", "/v1/webhooks", "200"),
        ("post", "/v1/webhooks/{id}/rotate-secret", "200"),
        ("post", "/v1/sources/batch", "200"),
    ],
)
def test_the_hand_written_models_answer_untyped_operations(
    document: dict[str, Any], method: str, path: str, status: str
) -> None:
    operation = document["paths"][path][method]
    schema = operation["responses"][status]["content"]["application/json"]["schema"]
    text = str(schema)
    if path == "/v1/sources/batch":
        # Typed as a list of plain objects: the items are a receipt or an error.
        ref = schema.get("$ref", "").rsplit("/", 1)[-1]
        items = document["components"]["schemas"][ref]["properties"]["results"]["items"]
        assert "$ref" not in str(items), items
        return
    assert "$ref" not in text, f"{method} {path} is typed now ({text}): generate its model"


def test_the_models_the_client_uses_are_in_the_document(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    for name in _generated.SCHEMAS:
        assert name in schemas, name
    for name in ("Acceptance", "SearchResponse", "RevisionDetail", "SourceView", "TokenInfo"):
        assert name in _generated.SCHEMAS, name


def test_the_packages_come_from_the_wheels() -> None:
    import os

    import cairn_client
    import langchain_cairn
    import llama_index.retrievers.cairn

    venv = os.environ.get("CAIRN_CLIENTS_VENV")
    if not venv:
        pytest.skip("not run from a venv made of the wheels")
    for module in (cairn_client, langchain_cairn, llama_index.retrievers.cairn):
        assert str(Path(module.__file__ or "").resolve()).startswith(str(Path(venv).resolve())), (
            module
        )
