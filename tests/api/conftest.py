import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def _fresh_throttle() -> None:
    # The throttle counts in the default (local-memory) cache: one test's requests must not
    # use up the next one's budget.
    cache.clear()
