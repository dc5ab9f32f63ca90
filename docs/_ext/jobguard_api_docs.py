"""Sphinx extension: the REST API reference, generated from the API's OpenAPI document.

``` ```{jobguard-api} ``` ``` writes one section per endpoint (its permissions, parameters, request
body and responses) and one per object, from :func:`django_jobguard.api.schema.build_schema`
and each view's ``required_permissions``, so the page cannot drift from the code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

METHOD_ORDER = {"get": 0, "post": 1}


def _cell(text: Any) -> str:
    """One Markdown table cell: no newlines or pipes."""
    return re.sub(r"\s+", " ", str(text or "")).replace("|", "\\|").strip()


#: The document's component schemas, while a page is written (enums are shown inline).
_COMPONENTS: dict[str, Any] = {}


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        target = _COMPONENTS.get(name, {})
        if "enum" in target:
            return f"{target.get('type', 'string')}, one of " + ", ".join(f"`{v}`" for v in target["enum"])
        return f"{{ref}}`{name} <object-{name.lower()}>`"
    if "allOf" in schema:
        return " ".join(_type(part) for part in schema["allOf"])
    if "oneOf" in schema:
        return " or ".join(_type(part) for part in schema["oneOf"])
    kind = schema.get("type", "any JSON")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        inner = schema["additionalProperties"]
        return "object" if inner is True or inner == {} else f"object of {_type(inner)}"
    if "format" in schema:
        kind = f"{kind} ({schema['format']})"
    return str(kind)


def _limits(schema: dict[str, Any]) -> str:
    notes = []
    if "enum" in schema:
        notes.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"] if v not in ("", None)))
    for key, label in (
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
    ):
        if key in schema:
            notes.append(f"{label} {schema[key]}")
    if schema.get("nullable"):
        notes.append("may be null")
    return "; ".join(notes)


def _view_permissions() -> dict[str, dict[str, tuple[str, ...]]]:
    """Path (as the schema writes it) → method → permissions, from the API's URL patterns.

    A replay step's view lets the service check the step's own permission (and the
    two-person rule); it is listed after the view's.
    """
    from django.urls import URLPattern

    from django_jobguard import dlq
    from django_jobguard.api import urls

    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for pattern in urls.urlpatterns:
        if not isinstance(pattern, URLPattern):
            continue
        route = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))
        view = getattr(pattern.callback, "view_class", None)
        needed = dict(getattr(view, "required_permissions", {}))
        action = getattr(view, "replay_action", None)
        if action is not None:
            needed = {method: (*perms, dlq.PERMISSIONS[action]) for method, perms in needed.items()}
        out[route] = needed
    return out


def api_markdown(schema: dict[str, Any]) -> str:
    """The reference page's body for ``schema`` (an OpenAPI 3 document)."""
    permissions = _view_permissions()
    components = schema.get("components", {}).get("schemas", {})
    _COMPONENTS.clear()
    _COMPONENTS.update(components)
    out: list[str] = ["## Endpoints", ""]
    for path, item in schema["paths"].items():
        for method, op in sorted(item.items(), key=lambda pair: METHOD_ORDER.get(pair[0], 9)):
            out += [f"### `{method.upper()} {path.lstrip('/')}`", ""]
            if op.get("description"):
                out += [op["description"].strip(), ""]
            needed = permissions.get(path, {}).get(method.upper(), ())
            perms = ", ".join(f"`{p}`" for p in needed) if needed else "any authenticated user"
            out += [f"**Permissions:** {perms}. Operation id: `{op['operationId']}`.", ""]
            params = op.get("parameters", [])
            if params:
                out += ["| Parameter | In | Type | Notes |", "| --- | --- | --- | --- |"]
                for param in params:
                    notes = "; ".join(
                        filter(None, [_cell(param.get("description")), _limits(param.get("schema", {}))])
                    )
                    kind = _type(param.get("schema", {}))
                    out.append(f"| `{param['name']}` | {param['in']} | {kind} | {_cell(notes)} |")
                out.append("")
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                out += [f"**Request body** (`application/json`): {_type(body['schema'])}.", ""]
            out += ["| Status | Body | When |", "| --- | --- | --- |"]
            for status, response in sorted(op["responses"].items()):
                content = response.get("content", {})
                media, spec = next(iter(content.items())) if content else ("", {})
                kind = f"{_type(spec.get('schema', {}))} (`{media}`)" if media else "none"
                out.append(f"| {status} | {kind} | {_cell(response.get('description'))} |")
            out.append("")
    out += ["## Objects", ""]
    for name, component in components.items():
        if "properties" not in component:
            continue
        out += [f"(object-{name.lower()})=", f"### Object `{name}`", ""]
        if component.get("description"):
            out += [component["description"].strip(), ""]
        required = set(component.get("required", []))
        out += ["| Field | Type | Always present / required | Notes |", "| --- | --- | --- | --- |"]
        for field, spec in component["properties"].items():
            notes = "; ".join(filter(None, [_cell(spec.get("description")), _limits(spec)]))
            flag = "yes" if field in required else "no"
            out.append(f"| `{field}` | {_type(spec)} | {flag} | {_cell(notes)} |")
        out.append("")
    return "\n".join(out)


class ApiDirective(SphinxDirective):
    """``jobguard-api``: the endpoints and objects of the REST API."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        import django_jobguard
        from django_jobguard.api.schema import build_schema

        for path in (Path(django_jobguard.__file__).parent / "api").rglob("*.py"):
            self.env.note_dependency(str(path.resolve()))
        return self.parse_text_to_nodes(api_markdown(build_schema()), allow_section_headings=True)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("jobguard-api", ApiDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
