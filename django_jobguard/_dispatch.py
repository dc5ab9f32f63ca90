"""Sending our signals so that a failing receiver is logged and never breaks a job or a worker."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_jobguard.signals")


def send(signal: Signal, **kwargs: Any) -> None:
    """Send ``signal`` (sender None) to every receiver; log receivers that raise."""
    if not signal.has_listeners(None):
        return
    for receiver, response in signal.send_robust(sender=None, **kwargs):
        if isinstance(response, Exception):
            logger.error(
                "signal_receiver_failed receiver=%s",
                getattr(receiver, "__qualname__", receiver),
                exc_info=response,
            )
