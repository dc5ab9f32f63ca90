"""Flow control: the specs a task or the settings declare (:class:`Limit`, :class:`Rate`).

Today it holds the specs (:mod:`.specs`); the plan of the declared limits and admission,
still in ``store/flow_sql.py``, are to move here. Every public name imports from ``django_jobguard.flow``.
"""

from __future__ import annotations

from .specs import (
    MAX_LIMIT_KEY_LENGTH,
    MAX_STORED_RATE_KEY_LENGTH,
    Limit,
    Rate,
    concurrency_spec,
    keyed_rate_room,
    over_long_rate_keys,
    parse_rate,
    rate_spec,
    stored_flow_keys,
    template_fields,
)

__all__ = [
    "MAX_LIMIT_KEY_LENGTH",
    "MAX_STORED_RATE_KEY_LENGTH",
    "Limit",
    "Rate",
    "concurrency_spec",
    "keyed_rate_room",
    "over_long_rate_keys",
    "parse_rate",
    "rate_spec",
    "stored_flow_keys",
    "template_fields",
]
