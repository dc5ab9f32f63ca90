"""``manage.py jobguard_prune``: parse options, then call the retention service.

See :func:`django_jobguard.maintenance.retention.prune`.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ...maintenance.retention import prune
from ._options import add_database_argument, database_alias, duration, positive_int


class Command(BaseCommand):
    help = (
        "Delete expired idempotency keys (never one whose job is queued or running), rows of database "
        "locks released or expired more than a day ago, flow-control rate keys idle for an hour and, "
        "with --jobs-older-than, finished jobs that "
        "no live key or dead letter refers to. Deletes in batches."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--jobs-older-than",
            type=duration,
            default=None,
            metavar="AGE",
            help=(
                "Also delete jobs that finished more than AGE ago: a number of seconds, or with a unit "
                "s, m, h, d or w (30d). Default: keep every job."
            ),
        )
        parser.add_argument(
            "--history-older-than",
            type=duration,
            default=None,
            metavar="AGE",
            help=(
                "Also trim the attempt history of jobs that finished more than AGE ago (those kept, "
                "such as dead jobs) to their last attempt, without its traceback. Default: keep it."
            ),
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=None,
            help="Rows deleted per statement (default 1000 keys, 500 jobs).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        report = prune(
            database_alias(options),
            jobs_older_than=options["jobs_older_than"],
            history_older_than=options["history_older_than"],
            batch_size=options["batch_size"],
            dry_run=options["dry_run"],
        )
        verb = "Would delete" if report.dry_run else "Deleted"
        self.stdout.write(f"{verb} {report.keys} expired idempotency key(s).")
        self.stdout.write(f"{verb} {report.locks} idle database lock row(s).")
        if report.flow_rates:  # only projects with rate limits have such rows
            self.stdout.write(f"{verb} {report.flow_rates} idle flow-control rate row(s).")
        if report.jobs is not None:
            self.stdout.write(
                f"{verb} {report.jobs} finished job(s) older than {options['jobs_older_than']}."
            )
        if report.histories is not None:
            trim = "Would trim" if report.dry_run else "Trimmed"
            self.stdout.write(
                f"{trim} the attempt history of {report.histories} job(s) finished more than "
                f"{options['history_older_than']} ago."
            )
