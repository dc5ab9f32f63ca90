"""One event stream: sites emit typed events, sinks report them; a failing sink stops nothing."""

import logging

import pytest
from prometheus_client import REGISTRY

from django_jobguard import events
from django_jobguard.monitoring import beats, metrics


@pytest.fixture
def collected():
    seen = []
    events.add_sink(seen.append)
    yield seen
    events.remove_sink(seen.append)


def test_every_sink_gets_every_event_in_the_order_the_sinks_were_added(collected):
    order = []

    def first(event):
        order.append(("first", event))

    events.add_sink(first)
    events.add_sink(first)  # once only
    try:
        event = events.LeaseLost("q", "t", "ack")
        events.emit(event)
    finally:
        events.remove_sink(first)
    assert collected == [event]
    assert order == [("first", event)]
    events.emit(events.LeaseLost("q", "t", "retry"))
    assert order == [("first", event)], "a removed sink hears nothing more"


def test_a_sink_that_raises_stops_neither_the_others_nor_the_caller(collected, caplog):
    def broken(event):
        raise RuntimeError("sink down")

    events.add_sink(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="django_jobguard.events"):
            events.emit(events.KeyConflict("t", "enqueue"))
    finally:
        events.remove_sink(broken)
    assert collected == [events.KeyConflict("t", "enqueue")]
    assert "event_sink_failed event=KeyConflict" in caplog.text


def test_the_app_installs_the_metrics_and_console_sinks():
    labels = {"queue": "events-q", "task": "events-t"}
    before = REGISTRY.get_sample_value("jobguard_jobs_succeeded_total", labels) or 0.0
    beats._take_pending()  # what earlier tests counted
    events.emit(events.JobSucceeded("events-q", "events-t", 0.01))
    assert REGISTRY.get_sample_value("jobguard_jobs_succeeded_total", labels) == before + 1
    counted = beats._take_pending()
    assert any(queue == "events-q" and bucket[0] == 1 for (queue, _), bucket in counted.items())
    assert metrics.sink in events._sinks and beats.sink in events._sinks


def test_events_carry_no_payload_fields():
    import dataclasses

    names = {
        f.name
        for cls in map(getattr, [events] * len(events.__all__), events.__all__)
        if dataclasses.is_dataclass(cls)
        for f in dataclasses.fields(cls)
    }
    assert names <= {
        "queue",
        "task",
        "duration",
        "category",
        "retried",
        "reason",
        "operation",
        "count",
        "where",
        "action",
        "schedule",
        "lag",
        "cache",
        "status",
        "kind",  # a workflow's kind: chain, group, batch, graph
        "when",  # a workflow callback's: success, complete, dead
        "in_use",  # an event loop's coroutines running, and its slots
        "slots",
        "limit",  # a declared named limit (JOBGUARD["LIMITS"]), never one of its keys
        "from_state",  # a breaker's: closed, open, half_open
        "to_state",
        "age_seconds",  # the vacuum horizon's, and the oldest open job transaction's
        "xid_age",
    }
