"""Writes cairn_client's typed models from cairn's OpenAPI document.

    python tools/generate_models.py openapi.json > cairn-client/src/cairn_client/_generated.py

The document is the one `cairn serve` serves at `/openapi.json`. Every component schema with
properties becomes a pydantic model whose fields are its properties: required ones typed
as the schema says, the others optional. The client tests fetch the served document, run this
generator, and fail when the file in the package differs, so the models cannot drift from
the server silently.
"""

from __future__ import annotations

import json
import keyword
import sys
import textwrap
from typing import Any

HEADER = '''"""cairn's API models, generated from its OpenAPI document: do not edit by hand.

Regenerate with ``python tools/generate_models.py openapi.json`` (clients/python/); the
client tests fail while this file differs from what the served document generates.
"""

# ruff: noqa: D205

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    """A model of cairn's answers: fields a newer server adds are kept, not refused."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)'''


def ref_name(ref: str) -> str:
    """The schema name a ``$ref`` points to."""
    return ref.rsplit("/", 1)[-1]


def python_type(
    schema: dict[str, Any], names: set[str], schemas: dict[str, Any]
) -> tuple[str, bool]:
    """The Python type of a property's schema, and whether it admits null.

    A reference to a model is the model's name; one to any other schema (an enum of strings,
    an integer alias) is that schema's type.
    """
    if "$ref" in schema:
        name = ref_name(schema["$ref"])
        if name in names:
            return name, False
        if name in schemas:
            return python_type(schemas[name], names, schemas)
        return "Any", False
    for key in ("oneOf", "anyOf"):
        if key in schema:
            options = schema[key]
            nullable = any(option.get("type") == "null" for option in options)
            rest = [option for option in options if option.get("type") != "null"]
            if len(rest) == 1:
                inner, inner_null = python_type(rest[0], names, schemas)
                return inner, nullable or inner_null
            types = sorted({python_type(option, names, schemas)[0] for option in rest})
            return (" | ".join(types) if types else "Any"), nullable
    kind = schema.get("type")
    nullable = False
    if isinstance(kind, list):
        nullable = "null" in kind
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind == "string":
        return "str", nullable
    if kind == "integer":
        return "int", nullable
    if kind == "number":
        return "float", nullable
    if kind == "boolean":
        return "bool", nullable
    if kind == "array":
        inner, inner_null = python_type(schema.get("items", {}), names, schemas)
        return f"list[{inner} | None]" if inner_null else f"list[{inner}]", nullable
    if kind == "object":
        return "dict[str, Any]", nullable
    if "enum" in schema and all(isinstance(value, str) for value in schema["enum"]):
        return "str", nullable
    return "Any", False


def docstring(text: str | None, indent: str) -> list[str]:
    """A docstring's lines for ``text`` (its first paragraph), or none."""
    if not text:
        return []
    first = text.strip().split("\n\n", 1)[0].replace("\\", "\\\\").replace('"""', "'''")
    first = " ".join(first.split())
    if not first.endswith((".", "?", "!", ")", ":")):
        first += "."
    lines = textwrap.wrap(first, width=92 - len(indent))
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    return [f'{indent}"""{lines[0]}', *[f"{indent}{line}" for line in lines[1:]], f'{indent}"""']


def field_name(name: str) -> tuple[str, str | None]:
    """A property's attribute name, and its alias when the name is not a Python identifier."""
    if keyword.iskeyword(name) or not name.isidentifier():
        attribute = "".join(c if c.isalnum() or c == "_" else "_" for c in name) + "_"
        return attribute, name
    return name, None


def generate(document: dict[str, Any]) -> str:
    """The module's text for ``document``."""
    schemas: dict[str, Any] = document.get("components", {}).get("schemas", {})
    models = {
        name: schema
        for name, schema in schemas.items()
        if schema.get("type") == "object" and schema.get("properties")
    }
    names = set(models)
    out = [HEADER]
    for name in sorted(models):
        schema = models[name]
        required = set(schema.get("required", []))
        out.append("")
        out.append("")
        out.append(f"class {name}(Model):")
        out.extend(docstring(schema.get("description") or f"The {name} schema.", "    "))
        out.append("")
        for prop, prop_schema in schema["properties"].items():
            kind, nullable = python_type(prop_schema, names, schemas)
            attribute, alias = field_name(prop)
            optional = nullable or prop not in required
            annotation = f"{kind} | None" if optional and kind != "Any" else kind
            if alias is not None:
                default = "None, " if prop not in required else ""
                value = f' = Field({default}alias="{alias}")'
            else:
                value = " = None" if prop not in required else ""
            out.append(f"    {attribute}: {annotation}{value}")
            out.extend(docstring(prop_schema.get("description"), "    "))
    out.append("")
    out.append("")
    out.append("SCHEMAS = [")
    out.extend(f'    "{name}",' for name in sorted(models))
    out.append("]")
    out.append('"""The document\'s schemas that have a model here."""')
    return "\n".join(out) + "\n"


def main() -> None:
    """Reads the document named on the command line and writes the module to stdout."""
    with open(sys.argv[1], encoding="utf-8") as file:
        document = json.load(file)
    sys.stdout.write(generate(document))


if __name__ == "__main__":
    main()
