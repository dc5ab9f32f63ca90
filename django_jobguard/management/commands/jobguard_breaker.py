"""``manage.py jobguard_breaker open|close|list``: hold a dependency's breaker open, or close it."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import breakers
from ...exceptions import BreakerError
from ...monitoring.stats import breaker_stats
from ._options import add_database_argument, database_alias, operator


class Command(BaseCommand):
    help = (
        "Open a named limit's circuit breaker by hand (its jobs wait unclaimed, with no attempt "
        "charged, until it is closed by hand), close it (its jobs are claimed at the next poll), "
        "or list the breakers and retry budgets with their state."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["open", "close", "list"], help="What to do.")
        parser.add_argument("limit", nargs="?", help="The JOBGUARD['LIMITS'] entry (not with list).")
        parser.add_argument(
            "--reason",
            default="",
            help="Why: required to open, optional to close; kept in the audit trail.",
        )
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options)
        action, name = options["action"], options["limit"]
        if action == "list":
            if name:
                raise CommandError("list takes no limit name: it lists every breaker and retry budget.")
            rows = breaker_stats(alias)
            if not rows:
                self.stdout.write("No limit in JOBGUARD['LIMITS'] declares a breaker or a retry budget.")
            for row in rows:
                state = row.state + (" (by hand)" if row.manual else "") if row.breaker else "no breaker"
                self.stdout.write(
                    f"{row.limit}  {state}  calls {row.calls} failed {row.failures}  waiting {row.waiting}"
                    + (f"  retries left {row.budget_remaining}" if row.budget_remaining is not None else "")
                    + (f"  by {row.changed_by}: {row.reason}" if row.changed_by else "")
                )
            return
        if not name:
            raise CommandError(f"{action} needs the name of a limit with a breaker.")
        change = breakers.open_breaker if action == "open" else breakers.close
        try:
            result = change(name, actor=operator(), reason=options["reason"], using=alias)
        except BreakerError as exc:
            raise CommandError(str(exc)) from exc
        verb = "opened" if action == "open" else "closed"
        if result.changed:
            self.stdout.write(f"Breaker {name!r} {verb}.")
        else:
            self.stdout.write(f"Breaker {name!r} was already {verb} (by {result.changed_by}); nothing to do.")
