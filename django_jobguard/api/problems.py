"""Errors as RFC 9457 problem details (``application/problem+json``), and the JSON parser's limits.

Every error of the API has the same shape::

    {"type": "about:blank", "title": "Bad Request", "status": 400,
     "detail": "args: Arguments do not fit ...", "code": "invalid",
     "errors": {"args": ["Arguments do not fit ..."]}}

``errors`` maps each field to its messages (nested fields joined with dots: ``kwargs.items``;
errors not tied to one field under ``non_field_errors``), and is present on validation
errors only. ``code`` is a stable machine-readable name; the documentation lists them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser
from rest_framework.response import Response

from ..conf import get_settings
from ..exceptions import (
    IdempotencyConflict,
    InvalidArgumentsError,
    InvalidTaskError,
    ReplayConflict,
    ReplayError,
    ReplayPermissionDenied,
    ReplayReviewRequired,
)

__all__ = [
    "PROBLEM_CONTENT_TYPE",
    "Conflict",
    "SafeJSONParser",
    "exception_handler",
    "json_depth",
]

PROBLEM_CONTENT_TYPE = "application/problem+json"
#: The parser refuses bodies nested deeper than this many times MAX_DEPTH (plus the body
#: object), before parsing; between MAX_DEPTH and that, the serializer names the field.
PARSER_DEPTH_FACTOR = 2
#: Bytes a request body may carry beyond MAX_PAYLOAD_BYTES (field names, options, reason).
ENVELOPE_BYTES = 16 * 1024


class Conflict(exceptions.APIException):
    """409: the request clashes with the resource's state (idempotency key, job or replay state)."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state of the resource."
    default_code = "conflict"


def json_depth(text: str | bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text, without parsing it.

    Linear and iterative, so a body of a million ``[`` cannot exhaust the parser's recursion.
    """
    data = text.encode() if isinstance(text, str) else text
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


class SafeJSONParser(JSONParser):
    """DRF's JSON parser with the API's limits: body size and nesting depth checked before parsing."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limits = get_settings().api
        most = limits.max_payload_bytes + ENVELOPE_BYTES
        body = stream.read(most + 1) if stream is not None else b""
        if len(body) > most:
            raise exceptions.ParseError(
                f"The request body is larger than {most} bytes "
                f'(JOBGUARD["API"]["MAX_PAYLOAD_BYTES"] plus {ENVELOPE_BYTES} for the envelope).',
                code="payload_too_large",
            )
        if json_depth(body) > PARSER_DEPTH_FACTOR * limits.max_depth + 1:
            raise exceptions.ParseError(
                f'JSON is nested deeper than {limits.max_depth} levels (JOBGUARD["API"]["MAX_DEPTH"]).',
                code="too_deep",
            )
        try:
            return json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise exceptions.ParseError(
                f"The request body is not valid JSON: {exc}", code="parse_error"
            ) from None


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; Python's parser accepts them unless told not to.
    raise ValueError(f"{name} is not valid JSON")


def _flatten(errors: Any, prefix: str = "") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if isinstance(errors, Mapping):
        for key, value in errors.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(errors, list) and errors and all(isinstance(e, str) for e in errors):
        out[prefix or "non_field_errors"] = [str(e) for e in errors]
    elif isinstance(errors, list):
        for index, value in enumerate(errors):
            if value:
                out.update(_flatten(value, f"{prefix}.{index}" if prefix else str(index)))
    else:
        out[prefix or "non_field_errors"] = [str(errors)]
    return out


def _first_code(codes: Any) -> str:
    if isinstance(codes, Mapping):
        for value in codes.values():
            return _first_code(value)
    if isinstance(codes, list):
        for value in codes:
            return _first_code(value)
    return str(codes) if codes else "invalid"


def _translate(exc: Exception) -> Exception:
    """The service layer's errors as API exceptions (the service's message kept word for word)."""
    if isinstance(exc, ReplayPermissionDenied):
        return exceptions.PermissionDenied(str(exc))
    if isinstance(exc, ReplayConflict):
        return Conflict(str(exc), code="payload_changed")
    if isinstance(exc, ReplayReviewRequired):
        return exceptions.ValidationError({"correction_digest": [str(exc)]}, code="required")
    if isinstance(exc, ReplayError):
        return Conflict(str(exc), code="invalid_state")
    if isinstance(exc, IdempotencyConflict):
        return Conflict(str(exc), code="idempotency_conflict")
    if isinstance(exc, InvalidArgumentsError | InvalidTaskError):
        return exceptions.ValidationError({"non_field_errors": [str(exc)]}, code="invalid")
    if isinstance(exc, Http404):
        return exceptions.NotFound(str(exc) or None)
    if isinstance(exc, DjangoPermissionDenied):
        return exceptions.PermissionDenied(str(exc) or None)
    return exc


def _detail(fields: Mapping[str, list[str]]) -> str:
    """``"field: message; other: message"``; fields with the same messages are named together
    (arguments that do not bind concern ``args`` and ``kwargs`` alike: one message, not two)."""
    grouped: dict[str, list[str]] = {}
    for name, messages in fields.items():
        grouped.setdefault(" ".join(messages), []).append(name)
    return "; ".join(f"{', '.join(names)}: {message}" for message, names in grouped.items())


def exception_handler(exc: Exception, context: Mapping[str, Any]) -> Response | None:
    """The API views' DRF exception handler: every error a problem-details body."""
    exc = _translate(exc)
    if not isinstance(exc, exceptions.APIException):
        return None  # a bug: let Django answer 500 (and log it)
    code = exc.status_code
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(code).phrase,
        "status": code,
    }
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        body["detail"] = _detail(fields)
        body["code"] = _first_code(exc.get_codes())
        body["errors"] = fields
    else:
        body["detail"] = str(exc.detail)
        body["code"] = _first_code(exc.get_codes())
    headers: dict[str, str] = {}
    auth_header = getattr(exc, "auth_header", None)  # set by DRF's APIView on 401s
    if auth_header:
        headers["WWW-Authenticate"] = str(auth_header)
    wait = getattr(exc, "wait", None)
    if wait is not None:
        headers["Retry-After"] = str(int(wait))
    return Response(body, status=code, headers=headers, content_type=PROBLEM_CONTENT_TYPE)
