"""A bulk replay step on thousands of dead letters: set-based against one transaction per letter.

    python benchmarks/bench_bulk_replay.py [--database-url postgres://postgres@127.0.0.1:5432/jobguard_bench_bulk]
                                           [--letters 5000] [--runs 3]

Each run lays ``--letters`` fresh dead letters, then requests and approves their replays
twice over: with ``dlq.decide_many`` (what the admin's bulk actions call: a few statements
per chunk of 500) and letter by letter with ``request_replay`` / ``approve_replay`` (what
they did before: a transaction of several statements per letter). It prints the median
seconds of each over the runs, and the ratio (the statements per chunk are pinned by
``tests/integration/dlq/test_dlq_bulk.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/jobguard_bench_bulk"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("JOBGUARD_BENCH_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--letters", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from bench_scrape import ensure_database, setup_django

    ensure_database(args.database_url)
    setup_django(args.database_url)
    from django.contrib.auth.models import Permission, User
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from django_jobguard import dlq
    from django_jobguard.models import DeadLetter, ReplayEvent
    from tests.testapp import tasks_dlq  # noqa: F401 - registers the task the letters name

    call_command("migrate", verbosity=0)

    def user(name: str, *codenames: str) -> User:
        made, _ = User.objects.get_or_create(username=name, defaults={"is_staff": True})
        made.user_permissions.set(
            Permission.objects.filter(content_type__app_label="jobguard", codename__in=codenames)
        )
        return User.objects.get(pk=made.pk)

    requester = user("bench-requester", "request_replay", "view_deadletter")
    approver = user("bench-approver", "approve_replay", "view_deadletter")

    def lay() -> list[int]:
        ReplayEvent.objects.all().delete()
        DeadLetter.objects.all().delete()
        now = timezone.now()
        DeadLetter.objects.bulk_create(
            DeadLetter(
                task_name="tests.testapp.tasks_dlq.charge",
                queue_name="default",
                kwargs={"order_id": n, "amount": 100},
                attempts=1,
                max_attempts=1,
                reason="permanent_error",
                category="permanent",
                first_failed_at=now,
                last_failed_at=now,
            )
            for n in range(args.letters)
        )
        return list(DeadLetter.objects.order_by("pk").values_list("pk", flat=True))

    def set_based(ids: list[int]) -> None:
        assert len(dlq.decide_many(dlq.REQUEST, ids, requester, "bench").moved) == len(ids)
        assert len(dlq.decide_many(dlq.APPROVE, ids, approver, "bench").moved) == len(ids)

    def one_by_one(ids: list[int]) -> None:
        for pk in ids:
            dlq.request_replay(pk, requester, "bench")
        for pk in ids:
            dlq.approve_replay(pk, approver, "bench")

    figures: dict[str, list[float]] = {"decide_many": [], "one by one": []}
    ways: dict[str, Callable[[list[int]], None]] = {"decide_many": set_based, "one by one": one_by_one}
    for _ in range(args.runs):
        for name, way in ways.items():
            ids = lay()
            began = time.perf_counter()
            way(ids)
            figures[name].append(time.perf_counter() - began)
    print(
        f"{args.letters:,} dead letters, request then approve, {connection.vendor}, "
        f"medians of {args.runs} runs\n"
    )
    print(f"{'way':<12} {'seconds':>9} {'min-max':>15}")
    for name, values in figures.items():
        print(f"{name:<12} {statistics.median(values):9.2f} {f'{min(values):.2f}-{max(values):.2f}':>15}")
    ratio = statistics.median(figures["one by one"]) / statistics.median(figures["decide_many"])
    print(f"\ndecide_many is {ratio:.0f}x faster")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
