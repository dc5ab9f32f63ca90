"""``manage.py jobguard_prune``: parse options, then call the retention service.

See :func:`django_jobguard.maintenance.retention.prune`.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...conf import RETENTION_STATUSES, get_settings
from ...maintenance.retention import OUTBOX_RETENTION_RULE, RETENTION_RULE, prune
from ._options import add_database_argument, database_alias, duration, positive_int


class Command(BaseCommand):
    help = (
        "Delete finished jobs past their retention (JOBGUARD['RETENTION'] and each queue's "
        "retention, the rules the workers prune by), expired idempotency keys (never one whose job "
        "is queued or running), rows of database locks released or expired more than a day ago and "
        f"flow-control rate keys idle for an hour. {RETENTION_RULE} Also delivered and skipped "
        "outbox messages past RETENTION['OUTBOX_DELIVERED'] and ['OUTBOX_SKIPPED']. "
        f"{OUTBOX_RETENTION_RULE} Deletes in batches, a transaction each."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--jobs-older-than",
            type=duration,
            default=None,
            metavar="AGE",
            help=(
                "Delete the jobs that finished more than AGE ago, whatever their status and queue, "
                "instead of by their retention: a number of seconds, or with a unit s, m, h, d or w "
                "(30d). The jobs retention keeps whatever their age stay."
            ),
        )
        parser.add_argument(
            "--no-jobs",
            action="store_true",
            help="Delete no job: only keys, lock rows, rate keys and outbox messages (history, if asked).",
        )
        parser.add_argument(
            "--outbox-older-than",
            type=duration,
            default=None,
            metavar="AGE",
            help=(
                "Delete the delivered and skipped outbox messages settled more than AGE ago, instead "
                "of by their retention (30d). Pending and dead messages, and those their key's relay "
                "has not passed, stay."
            ),
        )
        parser.add_argument(
            "--no-outbox",
            action="store_true",
            help="Delete no outbox message.",
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
            help=(
                "Rows deleted per transaction (default: 1000 keys, RETENTION['BATCH_SIZE'] jobs and "
                "outbox messages)."
            ),
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["no_jobs"] and options["jobs_older_than"] is not None:
            raise CommandError("--no-jobs and --jobs-older-than contradict each other: give one.")
        if options["no_outbox"] and options["outbox_older_than"] is not None:
            raise CommandError("--no-outbox and --outbox-older-than contradict each other: give one.")
        report = prune(
            database_alias(options),
            jobs=not options["no_jobs"],
            jobs_older_than=options["jobs_older_than"],
            history_older_than=options["history_older_than"],
            outbox=not options["no_outbox"],
            outbox_older_than=options["outbox_older_than"],
            batch_size=options["batch_size"],
            dry_run=options["dry_run"],
        )
        verb = "Would delete" if report.dry_run else "Deleted"
        self.stdout.write(f"{verb} {report.keys} expired idempotency key(s).")
        self.stdout.write(f"{verb} {report.locks} idle database lock row(s).")
        if report.flow_rates:  # only projects with rate limits have such rows
            self.stdout.write(f"{verb} {report.flow_rates} idle flow-control rate row(s).")
        if report.jobs is not None:
            counts = ", ".join(f"{report.jobs_by_status.get(s, 0)} {s}" for s in RETENTION_STATUSES)
            rule = (
                f"finished more than {options['jobs_older_than']} ago"
                if options["jobs_older_than"] is not None
                else "past their retention"
            )
            self.stdout.write(f"{verb} {report.jobs} finished job(s) {rule} ({counts}).")
        # Only projects that use the outbox have such messages.
        if report.outbox is not None and (any(report.outbox.values()) or get_settings().outbox.destinations):
            rule = (
                f"settled more than {options['outbox_older_than']} ago"
                if options["outbox_older_than"] is not None
                else "past their retention"
            )
            self.stdout.write(
                f"{verb} {sum(report.outbox.values())} outbox message(s) {rule} "
                f"({report.outbox.get('delivered', 0)} delivered, {report.outbox.get('skipped', 0)} skipped)."
            )
        if report.histories is not None:
            trim = "Would trim" if report.dry_run else "Trimmed"
            self.stdout.write(
                f"{trim} the attempt history of {report.histories} job(s) finished more than "
                f"{options['history_older_than']} ago."
            )
