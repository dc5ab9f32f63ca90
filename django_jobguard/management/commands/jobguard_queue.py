"""``manage.py jobguard_queue pause|resume|list``: stop and restart claiming from a queue."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...admin.base import format_time
from ...exceptions import QueueError
from ...operations import queues
from ._options import add_database_argument, database_alias, operator


class Command(BaseCommand):
    help = (
        "Pause a queue (workers stop claiming from it at their next poll; enqueues still work, "
        "running jobs finish), resume it, or list the paused queues and their last change."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["pause", "resume", "list"], help="What to do.")
        parser.add_argument("queue", nargs="?", help="The queue to pause or resume (not with list).")
        parser.add_argument(
            "--reason",
            default="",
            help="Why: required to pause, optional to resume; kept in the audit trail.",
        )
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options)
        action = options["action"]
        if action == "list" and options["queue"]:
            raise CommandError("list takes no queue name: it lists every queue ever paused.")
        if action != "list" and not options["queue"]:
            raise CommandError(f"{action} needs the name of a queue.")
        if action == "list":
            rows = queues.states(using=alias)
            if not rows:
                self.stdout.write("No queue has been paused.")
            for row in rows:
                state = "paused" if row.paused else "running"
                self.stdout.write(
                    f"{row.queue}  {state}  since {format_time(row.changed_at)}  by {row.changed_by}"
                    + (f"  reason: {row.reason}" if row.reason else "")
                )
            return
        change = queues.pause if action == "pause" else queues.resume
        try:
            result = change(options["queue"], actor=operator(), reason=options["reason"], using=alias)
        except QueueError as exc:
            raise CommandError(str(exc)) from exc
        verb = "paused" if action == "pause" else "resumed"
        if result.changed:
            self.stdout.write(f"Queue {result.queue!r} {verb}.")
        elif result.changed_at is None:
            self.stdout.write(f"Queue {result.queue!r} was not paused; nothing to do.")
        else:
            self.stdout.write(
                f"Queue {result.queue!r} was already {verb} "
                f"(since {format_time(result.changed_at)} by {result.changed_by}); nothing to do."
            )
