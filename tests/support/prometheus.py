"""Prometheus helpers for tests: scrape and parse a metrics page, read the alert rules."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: (sample name, its labels) -> value.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; 0 when the labelled child was never touched (as Prometheus reads it)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def scrape_worker(port: int) -> Samples:
    """The page of a worker started with ``--metrics-port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return parse(response.read().decode())


def alert_rules() -> list[dict]:
    """Every rule of the shipped alert rules, docs/monitoring/alerts.yml."""
    document = yaml.safe_load((DOCS / "monitoring" / "alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]
