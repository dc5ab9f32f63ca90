"""``manage.py shop_demo``: every discipline of django-jobguard under load, with real workers."""

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.console import Console

from shop.demo.runner import Demo

#: Fewest orders the acts need (the crash, the lock contention and the resend pick from them).
MIN_ORDERS = 40


class Command(BaseCommand):
    help = (
        "Run the django-jobguard demo: real worker processes charge orders exactly once, retry a "
        "flaky provider, serialise syncs on a lock, survive a killed worker, dead-letter bad work, "
        "and prove it from the database."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--orders",
            type=int,
            default=240,
            help=f"Orders to check out (at least {MIN_ORDERS}; default 240).",
        )
        parser.add_argument(
            "--summary-json",
            type=Path,
            default=None,
            metavar="PATH",
            help="Also write the summary's figures as JSON to PATH.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["orders"] < MIN_ORDERS:
            raise CommandError(f"--orders {options['orders']}: the demo needs at least {MIN_ORDERS} orders.")
        console = Console(file=self.stdout, width=None if self.stdout.isatty() else 120)
        try:
            summary = Demo(console, options["orders"], options["summary_json"]).run()
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
        if not summary["ok"]:
            raise CommandError("a guarantee did not hold: see the rows marked NO above.")
