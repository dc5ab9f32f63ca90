"""The REST API: ``JOBGUARD["API"]``, its payload limits, page sizes and throttles."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ._values import fail, integer, number


@dataclasses.dataclass(frozen=True, slots=True)
class ApiSettings:
    """``JOBGUARD["API"]``."""

    max_payload_bytes: int
    max_depth: int
    page_size: int
    max_page_size: int
    enqueue_throttle_rate: str | None
    operate_throttle_rate: str | None
    run_after_past: float
    run_after_future: float


_RATE_PERIODS = ("s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day")


def _rate(value: Any, path: tuple[str, ...]) -> str | None:
    """A DRF throttle rate such as ``"600/minute"``, or None (no throttle)."""
    if value is None:
        return None
    count, _, period = value.partition("/") if isinstance(value, str) else ("", "", "")
    if not (count.isdigit() and period in _RATE_PERIODS):
        raise fail(
            path,
            f'must be a rate such as "600/minute" (per second, minute, hour or day) or None, not {value!r}.',
        )
    return str(value)


def parse_page_sizes(api: Mapping[str, Any]) -> tuple[int, int]:
    """``API["PAGE_SIZE"]`` and ``API["MAX_PAGE_SIZE"]``, the second not below the first."""
    page_size = integer(api["PAGE_SIZE"], ("API", "PAGE_SIZE"), minimum=1)
    max_page_size = integer(api["MAX_PAGE_SIZE"], ("API", "MAX_PAGE_SIZE"), minimum=1)
    if max_page_size < page_size:
        raise fail(("API", "MAX_PAGE_SIZE"), f"({max_page_size}) must not be below PAGE_SIZE ({page_size}).")
    return page_size, max_page_size


def parse_api_settings(api: Mapping[str, Any], page_size: int, max_page_size: int) -> ApiSettings:
    return ApiSettings(
        max_payload_bytes=integer(api["MAX_PAYLOAD_BYTES"], ("API", "MAX_PAYLOAD_BYTES"), minimum=2),
        max_depth=integer(api["MAX_DEPTH"], ("API", "MAX_DEPTH"), minimum=1),
        page_size=page_size,
        max_page_size=max_page_size,
        enqueue_throttle_rate=_rate(api["ENQUEUE_THROTTLE_RATE"], ("API", "ENQUEUE_THROTTLE_RATE")),
        operate_throttle_rate=_rate(api["OPERATE_THROTTLE_RATE"], ("API", "OPERATE_THROTTLE_RATE")),
        run_after_past=number(api["RUN_AFTER_PAST"], ("API", "RUN_AFTER_PAST")),
        run_after_future=number(api["RUN_AFTER_FUTURE"], ("API", "RUN_AFTER_FUTURE")),
    )
