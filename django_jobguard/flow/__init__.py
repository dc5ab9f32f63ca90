"""Flow control: the specs a task or the settings declare, the plan of them, and admission.

- :mod:`.specs`: :class:`Limit`, :class:`Rate`, the rate strings, the stored flow keys, and
  the shared limits of ``JOBGUARD["LIMITS"]`` (:class:`NamedLimit`, :class:`BreakerSpec`,
  :class:`RetryBudgetSpec`);
- :mod:`.plan`: :class:`FlowPlan`, what a limited claim enforces by key, built from plain
  values (:func:`build_plan`);
- :mod:`.admission`: what a limited claim admits, decided from what its turn read.

Pure: it imports only the errors, never the store, the models, the registry or a task; the
store's limited claim runs admission inside its SQL turn. Every public name imports from
``django_jobguard.flow``.
"""

from __future__ import annotations

from .admission import Admission, GateState, Throttle, hot_keys
from .plan import BreakerGate, FlowPlan, RateSpec, TaskLimits, build_plan, family
from .specs import (
    MAX_LIMIT_KEY_LENGTH,
    MAX_STORED_RATE_KEY_LENGTH,
    BreakerSpec,
    Limit,
    NamedLimit,
    Rate,
    RetryBudgetSpec,
    concurrency_spec,
    keyed_rate_room,
    over_long_rate_keys,
    parse_rate,
    rate_spec,
    read_flow_keys,
    stored_flow_keys,
    template_fields,
)

__all__ = [
    "MAX_LIMIT_KEY_LENGTH",
    "MAX_STORED_RATE_KEY_LENGTH",
    "Admission",
    "BreakerGate",
    "BreakerSpec",
    "FlowPlan",
    "GateState",
    "Limit",
    "NamedLimit",
    "Rate",
    "RateSpec",
    "RetryBudgetSpec",
    "TaskLimits",
    "Throttle",
    "build_plan",
    "concurrency_spec",
    "family",
    "hot_keys",
    "keyed_rate_room",
    "over_long_rate_keys",
    "parse_rate",
    "rate_spec",
    "read_flow_keys",
    "stored_flow_keys",
    "template_fields",
]
