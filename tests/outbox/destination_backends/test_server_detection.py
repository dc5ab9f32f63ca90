"""Without RabbitMQ or NATS the broker tests skip, saying how to start them; unless a run named them."""

from __future__ import annotations

import pytest

from tests.outbox.destination_backends.conftest import _server, closed_port


def test_a_server_that_does_not_answer_skips_with_how_to_start_it(monkeypatch) -> None:
    monkeypatch.delenv("JOBGUARD_TEST_NATS_URL", raising=False)
    url = f"nats://127.0.0.1:{closed_port()}"
    with pytest.raises(pytest.skip.Exception, match=r"no server at .* \(start NATS: nats-server -js"):
        _server(url, "JOBGUARD_TEST_NATS_URL", "start NATS: nats-server -js -a 127.0.0.1 -p 4222")


def test_a_server_the_run_named_must_answer(monkeypatch) -> None:
    url = f"nats://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("JOBGUARD_TEST_NATS_URL", url)
    with pytest.raises(pytest.fail.Exception, match="is set but nothing answers there"):
        _server(url, "JOBGUARD_TEST_NATS_URL", "start NATS")
