"""The OpenAPI 3 document of the API (drf-spectacular), with paths relative to where it is mounted."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.settings import patched_settings
from drf_spectacular.views import SpectacularAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from .permissions import JobguardPermission
from .problems import exception_handler
from .serializers import PAYLOAD_FIELD_NOTE, _PayloadHiding
from .views import documented

__all__ = ["SCHEMA_SETTINGS", "SchemaView", "build_schema"]

#: The document's version: the installed distribution's (no module of the package imports the
#: package root); a checkout on ``sys.path`` that was never installed has none.
try:
    VERSION = importlib.metadata.version("django-jobguard")
except importlib.metadata.PackageNotFoundError:
    VERSION = "0+unknown"

#: drf-spectacular settings of this API's document, whatever the project's SPECTACULAR_SETTINGS say.
SCHEMA_SETTINGS: dict[str, Any] = {
    "TITLE": "django-jobguard API",
    "DESCRIPTION": (
        "Jobs, dead letters, replays and queues of django-jobguard. Paths are relative to where "
        'the project mounts django_jobguard.api.urls (path("jobguard/api/", ...) in the docs). '
        "Errors are RFC 9457 problem details (application/problem+json)."
    ),
    "VERSION": VERSION,
    "SCHEMA_PATH_PREFIX": "",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_GENERATE_CHOICE_DESCRIPTION": False,
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "django_jobguard.models.JobStatus",
        "ReplayStateEnum": "django_jobguard.models.ReplayState",
        "DeadLetterReasonEnum": "django_jobguard.models.DeadLetterReason",
    },
}


class PayloadFieldsOptional(OpenApiSerializerExtension):
    """The fields a serializer drops without ``jobguard.view_payload`` are not ``required``: a
    client generated from the document must not expect them. Each says when it is left out."""

    target_class = _PayloadHiding
    match_subclasses = True

    def map_serializer(self, auto_schema: AutoSchema, direction: Any) -> dict[str, Any]:
        # As OpenApiSerializerExtension.map_serializer itself does (its documented way to augment).
        schema: dict[str, Any] = auto_schema._map_serializer(  # noqa: SLF001
            self.target, direction, bypass_extensions=True
        )
        hidden = set(getattr(self.target, "payload_fields", ()))
        required = [name for name in schema.get("required", []) if name not in hidden]
        if required:
            schema["required"] = required
        else:
            schema.pop("required", None)
        properties = schema.get("properties", {})
        for name in sorted(hidden & set(properties)):
            field = properties[name]
            if "$ref" in field:  # a reference takes no sibling keys in OpenAPI 3.0
                field = properties[name] = {"allOf": [field]}
            text = field.get("description", "")
            field["description"] = f"{text} {PAYLOAD_FIELD_NOTE}" if text else PAYLOAD_FIELD_NOTE
        return schema


def build_schema() -> dict[str, Any]:
    """The OpenAPI document, as ``GET schema/`` serves it (without the ``servers`` entry)."""
    with patched_settings(SCHEMA_SETTINGS):
        generator = SchemaGenerator(urlconf="django_jobguard.api.urls")
        return generator.get_schema(request=None, public=True)  # type: ignore[no-any-return]


class SchemaView(SpectacularAPIView):
    """``GET schema/``: the OpenAPI 3 document (JSON), for any authenticated user."""

    permission_classes = [JobguardPermission]
    required_permissions: dict[str, tuple[str, ...]] = {"GET": ()}
    custom_settings = SCHEMA_SETTINGS
    urlconf = "django_jobguard.api.urls"
    serve_public = True
    schema = AutoSchema()

    def get_exception_handler(self) -> Any:
        return exception_handler

    @documented(exclude=True)
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        response: Response = super().get(request, *args, **kwargs)
        # The paths are relative to the mount point: tell clients where that is.
        base = request.build_absolute_uri(request.path).rsplit("schema/", 1)[0].rstrip("/")
        response.data = {**response.data, "servers": [{"url": base}]}
        return response
