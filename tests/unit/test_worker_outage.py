"""A worker's view of a database outage: the back-off's bounds and one log line per interval."""

from __future__ import annotations

import logging

import pytest

from django_jobguard.worker import outage
from django_jobguard.worker.outage import DatabaseOutage, backoff_delay


@pytest.mark.parametrize(
    ("failures", "ceiling"), [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 5.0), (40, 5.0)]
)
def test_the_back_off_doubles_to_its_cap_with_jitter_below_it(failures, ceiling):
    delays = [backoff_delay(failures, 0.5, 5.0) for _ in range(200)]
    assert all(ceiling / 2 <= delay <= ceiling for delay in delays)
    assert len({round(delay, 6) for delay in delays}) > 100  # spread, not one instant for every worker


def test_an_outage_is_logged_once_then_once_per_interval_then_its_end(monkeypatch, caplog):
    clock = [1000.0]
    monkeypatch.setattr(outage.time, "monotonic", lambda: clock[0])
    tracker = DatabaseOutage("w1", log_interval=30)
    caplog.set_level(logging.INFO, logger="django_jobguard.worker")
    error = OSError("connection refused")
    for _ in range(200):  # 100 s of failures from two threads, two tries a second
        try:
            raise error
        except OSError as exc:
            tracker.failed("claim", exc)
            tracker.failed("heartbeat", exc)
        clock[0] += 0.5
        assert not tracker.healthy
    tracker.recovered()
    tracker.recovered()  # a second success says nothing
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0].startswith("claim_failed worker_id=w1; database_unreachable")
    assert caplog.records[0].exc_info is not None
    still = [m for m in messages if m.startswith("database_still_unreachable")]
    assert [m.split()[2] for m in still] == ["for=30s", "for=60s", "for=90s"]
    assert messages[-1] == "database_reachable worker_id=w1 after=100.0s failures=400; resuming"
    assert len(messages) == 5
    assert tracker.healthy and tracker.failures == 0
