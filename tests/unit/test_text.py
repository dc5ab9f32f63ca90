"""Stored error text is capped, keeping its head and tail."""

import pytest

from django_jobguard._text import clip


def test_text_within_the_limit_is_unchanged():
    assert clip("short", 10) == "short"
    assert clip("x" * 10, 10) == "x" * 10


@pytest.mark.parametrize("size", [257, 1000, 240_000])
def test_long_text_keeps_head_and_tail_within_the_limit(size):
    text = "HEAD" + "m" * (size - 8) + "TAIL"
    clipped = clip(text, 256)
    assert len(clipped) <= 256
    assert clipped.startswith("HEAD") and clipped.endswith("TAIL")
    assert "characters cut" in clipped
    assert clip(clipped, 256) == clipped
