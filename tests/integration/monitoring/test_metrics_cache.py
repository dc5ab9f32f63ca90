"""The queue gauges are computed once per METRICS_CACHE_SECONDS, however many scrapers ask."""

import threading

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_jobguard.monitoring import metrics
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def depth(collector):
    for family in collector.collect():
        if family.name == "jobguard_queue_depth":
            return {sample.labels["queue"]: sample.value for sample in family.samples}
    raise AssertionError("no depth family")


def test_scrapes_within_the_interval_share_one_computation():
    collector = metrics.QueueCollector()
    tasks.add.enqueue(1)
    with override_settings(JOBGUARD={**settings.JOBGUARD, "METRICS_CACHE_SECONDS": 60.0}):
        with CaptureQueriesContext(connection) as first:
            assert depth(collector)["default"] == 1
        tasks.add.enqueue(2)
        with CaptureQueriesContext(connection) as later:
            for _ in range(5):
                assert depth(collector)["default"] == 1  # the cached figure, no query
        assert len(first.captured_queries) > 0 and len(later.captured_queries) == 0
    # With the cache off every scrape queries.
    assert depth(collector)["default"] == 2


def test_concurrent_scrapers_run_one_set_of_queries():
    collector = metrics.QueueCollector()
    tasks.add.enqueue(1)
    calls = []
    original = metrics.queue_stats

    def counted(alias):
        calls.append(alias)
        return original(alias)

    results = []
    with override_settings(JOBGUARD={**settings.JOBGUARD, "METRICS_CACHE_SECONDS": 60.0}):
        metrics.queue_stats, restore = counted, original
        try:
            threads = [threading.Thread(target=lambda: results.append(depth(collector))) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
        finally:
            metrics.queue_stats = restore
    assert len(results) == 8 and all(result["default"] == 1 for result in results)
    assert len(calls) == 1
