"""The admin's SVG charts: one bar per sample, gaps for missing samples, every label escaped."""

import datetime

import pytest

from django_jobguard.admin.charts import bar_chart, nice_ceiling

MINUTES = [datetime.datetime(2026, 12, 1, 9, m, tzinfo=datetime.UTC) for m in range(3)]


def test_a_chart_draws_one_bar_per_sample_and_leaves_gaps():
    svg = str(bar_chart("Failed <b>", MINUTES, [1.0, None, 4.0], unit="attempts"))
    assert svg.count("<rect") == 2
    assert "<title>Failed &lt;b&gt;</title>" in svg and "<b>" not in svg
    assert "<title>09:02 UTC: 4 attempts</title>" in svg
    assert 'text-anchor="end" class="tick">5<' in svg  # a round maximum at or above the peak labels the axis


def test_an_empty_chart_still_renders_an_axis():
    svg = str(bar_chart("Nothing", MINUTES, [None, None, None]))
    assert "<rect" not in svg and 'class="axis"' in svg


@pytest.mark.parametrize(
    ("largest", "axis"),
    [(0.0, 1.0), (0.3, 0.5), (1.0, 1.0), (4.00735, 5.0), (12.0, 20.0), (21.0, 25.0), (730.0, 1000.0)],
)
def test_the_axis_maximum_is_a_round_number_at_or_above_the_largest_value(largest, axis):
    assert nice_ceiling(largest) == pytest.approx(axis)


def test_labels_and_tooltips_keep_three_significant_digits():
    svg = str(bar_chart("Oldest", MINUTES, [4.00735, 0.00735, 2.5], unit="seconds"))
    assert 'class="tick">5<' in svg and ".00735<" not in svg.split("</title>", 1)[1].split("<rect")[0]
    assert "<title>09:00 UTC: 4.01 seconds</title>" in svg
    assert "<title>09:01 UTC: 0.00735 seconds</title>" in svg
    big = str(bar_chart("Succeeded", MINUTES, [12345.0, None, None], unit="jobs"))
    assert "12.3k jobs" in big and 'class="tick">20k<' in big
