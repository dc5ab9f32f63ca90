"""``manage.py jobguard_tune``: visibility timeouts from the observed durations of finished jobs."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from ...conf import get_settings
from ...monitoring.tuning import SPLIT_FLOOR_SECONDS, QueueReport, report
from ._options import add_database_argument, database_alias, window

DEFAULT_SINCE = "24h"


def _window_text(seconds: float) -> str:
    """``86400`` as ``24h``: the window as an operator would have typed it (days from a week)."""
    if seconds >= 7 * 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g}d"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


class Command(BaseCommand):
    help = (
        "Show, per queue and per task, how long recent jobs ran (p50, p95, p99, max, count, "
        "from claim to ack of succeeded jobs), the visibility timeout they get, and the one "
        "their p99 calls for; flag tasks whose p99 outlasts their timeout and queues whose "
        "tasks should be split. Reads only; changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", default=None, help="Only this queue (default: every queue).")
        parser.add_argument(
            "--since",
            type=window,
            default=window(DEFAULT_SINCE),
            metavar="WINDOW",
            help=f"Jobs finished within this window: 90s, 30m, 24h, 7d or seconds (default {DEFAULT_SINCE}).",
        )
        parser.add_argument("--json", action="store_true", help="Print JSON for scripts instead of text.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options)
        since = options["since"]
        reports = report(alias, since=since, queue=options["queue"])
        if options["json"]:
            self.stdout.write(json.dumps(self._document(alias, since, reports), sort_keys=True))
        else:
            self._print(since, reports, options["queue"])

    def _document(self, alias: str, since: float, reports: list[QueueReport]) -> dict[str, Any]:
        tuning = get_settings().tuning
        return {
            "generated_at": timezone.now().isoformat(),
            "database": alias,
            "since_seconds": since,
            "safety_factor": tuning.safety_factor,
            "heartbeat_margin_seconds": tuning.heartbeat_margin,
            "queue_split_factor": tuning.queue_split_factor,
            "queues": [
                {
                    "queue": queue.queue,
                    "visibility_timeout": queue.visibility_timeout,
                    "recommended_visibility_timeout": queue.recommended,
                    "reason": queue.reason,
                    "split": queue.split is not None,
                    "tasks": [
                        {
                            "task": item.durations.task,
                            "count": item.durations.count,
                            "p50": item.durations.p50,
                            "p95": item.durations.p95,
                            "p99": item.durations.p99,
                            "max": item.durations.max,
                            "visibility_timeout": item.visibility_timeout,
                            "recommended_visibility_timeout": item.recommended,
                            "reason": item.reason,
                            "exceeds_timeout": item.exceeds_timeout,
                            "few_runs": item.few_runs,
                        }
                        for item in queue.tasks
                    ],
                }
                for queue in reports
            ],
        }

    def _print(self, since: float, reports: list[QueueReport], queue: str | None) -> None:
        where = f"queue {queue!r}" if queue else "any queue"
        if not reports:
            self.stdout.write(
                f"No succeeded jobs in {where} in the last {_window_text(since)}: nothing to tune from."
            )
            return
        factor = get_settings().tuning.queue_split_factor
        self.stdout.write(f"Succeeded jobs of the last {_window_text(since)}, seconds from claim to ack.")
        for item in reports:
            self.stdout.write("")
            self.stdout.write(
                f"queue {item.queue}: visibility timeout {item.visibility_timeout:g}s, "
                f"recommended {item.recommended:g}s ({item.reason})"
            )
            self.stdout.write(
                f"  {'task':<48} {'count':>7} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}  timeout"
            )
            for row in item.tasks:
                d = row.durations
                weak = (
                    f"  (only {d.count} runs in the window; JOBGUARD['TUNING']['MIN_RUNS'] is "
                    f"{row.min_runs}: a weak basis)"
                    if row.few_runs
                    else ""
                )
                self.stdout.write(
                    f"  {d.task:<48} {d.count:>7} {d.p50:>8.3f} {d.p95:>8.3f} {d.p99:>8.3f} {d.max:>8.3f}  "
                    f"{row.visibility_timeout:g}s -> {row.recommended:g}s{weak}"
                )
                if row.exceeds_timeout:
                    self.stdout.write(
                        self.style.WARNING(
                            f"  ! {d.task}: p99 {d.p99:.3g}s outlasts its visibility timeout of "
                            f"{row.visibility_timeout:g}s; a heartbeat that stalls lets such runs "
                            f"reappear. Set visibility_timeout={row.recommended:g} ({row.reason})."
                        )
                    )
            if item.split is not None:
                fastest, slowest = item.split
                low = f"{fastest:.3g}s" + (" or less" if fastest <= SPLIT_FLOOR_SECONDS else "")
                self.stdout.write(
                    self.style.WARNING(
                        f"  ! split queue {item.queue}: p99s from {low} to {slowest:.3g}s, "
                        f"more than {factor:g}x apart; move the slow tasks to a queue of their own."
                    )
                )
