"""``celery.utils.time``'s backoff helper, for tasks that compute their own ``countdown``."""

from __future__ import annotations

import random

__all__ = ["get_exponential_backoff_interval"]


def get_exponential_backoff_interval(
    factor: int, retries: int, maximum: int, full_jitter: bool = False
) -> int:
    """Seconds to wait before retry number ``retries + 1``: ``factor * 2**retries``, at most ``maximum``.

    With ``full_jitter`` a whole number drawn at random between 0 and that delay, as Celery's
    ``retry_jitter`` does. ``self.request.retries`` counts the retries so far, as in Celery.
    """
    delay: int = min(maximum, factor * 2**retries)
    if full_jitter:
        delay = random.randint(0, max(delay, 0))  # noqa: S311 - spreads retries, not a secret
    return max(0, delay)
