"""Encryption keys for the rotation tests: set them as a deployment does, in the environment."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from contextlib import contextmanager

from django_jobguard.conf import reload

ENV = "JOBGUARD_ENCRYPTION_KEYS"


def make_key(key_id: str, seed: int) -> str:
    """A fixed "key_id:base64" key (32 bytes derived from ``seed``)."""
    return f"{key_id}:{base64.urlsafe_b64encode(bytes((seed + i) % 256 for i in range(32))).decode()}"


K1 = make_key("k1", 1)
K2 = make_key("k2", 101)
K3 = make_key("k3", 201)


def set_keys(*keys: str) -> None:
    """Make ``keys`` (newest first) this process's keys, and the workers' it starts from now on."""
    os.environ[ENV] = ",".join(keys)
    reload()


@contextmanager
def keys_restored() -> Iterator[None]:
    """Put the suite's keys back afterwards, whatever the test set."""
    before = os.environ.get(ENV)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
        reload()
