"""Fixtures of the database-only store tests: the flow tasks (as in tests/store_contract/)."""

from tests.support.flow_tasks import claims_start_from_the_head, flow_tasks, unguarded_tasks

__all__ = ["claims_start_from_the_head", "flow_tasks", "unguarded_tasks"]
