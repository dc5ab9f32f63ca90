"""Driver for django-tasks with the django-tasks-db back end (runs in benchmarks/.venv-peers).

The worker is the package's own ``manage.py db_worker`` (one task at a time per process),
run with ``--batch`` (exit when empty), ``--no-startup-delay``, ``--verbosity 0``
(no log line per task) and otherwise its defaults (1 s poll interval).
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks._common import CpuMeter, driver_parser, paced, timed_enqueue, wait_for_go


def enqueue(args: Any) -> None:
    from benchmarks.peers.dtdb_tasks import noop

    if args.mode == "bulk":
        raise SystemExit("django-tasks has no bulk enqueue API")

    def single() -> None:
        for i in paced(range(args.start, args.start + args.n), args.rate):
            noop.enqueue(i)

    timed_enqueue(args.n, args.out, single, args.profile)


def worker(args: Any) -> None:
    from django.core.management import call_command

    wait_for_go(args)
    meter = CpuMeter()
    options = ["--queue-name", "default", "--verbosity", "0", "--no-startup-delay"]
    options += ["--worker-id", f"bench-{args.index}-{os.getpid()}"]
    if args.burst:
        options.append("--batch")
    try:
        call_command("db_worker", *options)
    finally:
        meter.report(args.out)


def main() -> None:
    args = driver_parser(__doc__ or "").parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.peers.dtdb_settings")
    import django

    django.setup()
    {"enqueue": enqueue, "worker": worker}[args.command](args)


if __name__ == "__main__":
    main()
