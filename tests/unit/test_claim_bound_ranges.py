"""The ranges a bounded claim on PostgreSQL reads cover every priority, in claim order.

Each remembered (queue, priority) is read from the last row claimed there; every other
priority, above, between and below, is read from its start (the SQL is in
tests/integration/store/test_claim_bound.py).
"""

from django_jobguard.store import postgres
from django_jobguard.store.postgres import _EARLIEST, _ClaimBound

#: Positions are the claim's fixed-width UTC text, which sorts as the time does.
T = "2026-12-07T09:00:00.000000Z"


def test_without_positions_one_range_covers_every_priority_from_its_start() -> None:
    assert _ClaimBound().ranges("q") == [("q", -32768, 32767, *_EARLIEST)]


def test_remembered_priorities_start_at_their_last_claimed_row_and_the_gaps_at_their_start() -> None:
    bound = _ClaimBound()
    bound.advance([("q", 0, T, 5), ("q", 0, T, 7), ("q", 10, T, 3), ("other", 0, T, 9)])
    assert bound.ranges("q") == [
        ("q", 11, 32767, *_EARLIEST),
        ("q", 10, 10, T, 3),
        ("q", 1, 9, *_EARLIEST),
        ("q", 0, 0, T, 7),
        ("q", -32768, -1, *_EARLIEST),
    ]
    # Adjacent priorities leave no empty gap between them.
    bound.advance([("q", 9, T, 4)])
    assert [(lo, hi) for _, lo, hi, _, _ in bound.ranges("q")] == [
        (11, 32767), (10, 10), (9, 9), (1, 8), (0, 0), (-32768, -1),
    ]  # fmt: skip


def test_a_claim_behind_the_position_moves_it_back_so_the_rows_after_it_are_read_again() -> None:
    bound = _ClaimBound()
    bound.advance([("q", 0, T, 7)])
    earlier = "2026-12-07T08:00:00.000000Z"
    bound.advance([("q", 0, earlier, 2)])  # a full claim took a job behind the position
    assert ("q", 0, 0, earlier, 2) in bound.ranges("q")


def test_the_least_recently_claimed_positions_are_forgotten_past_the_limit(monkeypatch) -> None:
    monkeypatch.setattr(postgres, "CLAIM_BOUND_POSITIONS", 2)
    bound = _ClaimBound()
    bound.advance([("q", 1, T, 1)])
    bound.advance([("q", 2, T, 2)])
    bound.advance([("q", 1, T, 3)])
    bound.advance([("q", 3, T, 4)])
    assert sorted(bound.positions) == [("q", 1), ("q", 3)]
