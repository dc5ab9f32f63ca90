"""``manage.py jobguard_status``: the queues at a glance, as a table or JSON, once or refreshed."""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ...conf import get_settings
from ...models import WorkerBeat
from ...monitoring import beats
from ...monitoring.beats import STALE_AFTER_SECONDS
from ...monitoring.health import HorizonHold, horizon_holds
from ...monitoring.stats import (
    BreakerStats,
    EventLoopStats,
    LimitStats,
    QueueStats,
    ScheduleStats,
    breaker_stats,
    event_loop_stats,
    limit_stats,
    queue_stats,
    schedule_stats,
)
from ...outbox.stats import DestinationStats, HeldKey, destination_stats, held_keys, warn_after
from ._options import add_database_argument, check_queues, database_alias, positive_float, positive_int

#: Seconds between refreshes of ``--watch`` when none is given.
DEFAULT_WATCH_INTERVAL_SECONDS = 2.0
#: Workers whose last beat is older than this are left out (stopped long ago, not news).
STALE_WORKERS_SHOWN_SECONDS = 3600


def worker_health(alias: str) -> dict[str, Any]:
    """Live workers, and those whose beats stopped within the last hour.

    A worker that stops cleanly (SIGTERM, the end of ``--burst``) takes its row away. One
    stops beating without a word when it was killed, froze, or cannot reach the database (it
    cannot write its beat there): the last is how a database outage of some workers shows here.
    """
    now = timezone.now()
    since = now - datetime.timedelta(seconds=STALE_WORKERS_SHOWN_SECONDS)
    rows = WorkerBeat.objects.using(alias).filter(last_beat_at__gte=since).order_by("worker_id")
    live, stale = [], []
    for worker_id, last_beat_at in rows.values_list("worker_id", "last_beat_at"):
        if beats.is_stale(last_beat_at, now):
            stale.append(
                {"worker_id": worker_id, "seconds_since_beat": round((now - last_beat_at).total_seconds())}
            )
        else:
            live.append(worker_id)
    return {"live": live, "stale": stale}


_COLUMNS = (
    ("QUEUE", "queue"),
    ("DEPTH", "depth"),
    ("SCHEDULED", "scheduled"),
    ("IN-FLIGHT", "in_flight"),
    ("OLDEST AGE", "oldest_age_seconds"),
    ("DLQ", "dead_letters"),
    ("PENDING APPROVAL", "pending_approvals"),
    ("PAUSED", "paused"),
    ("OK 1H", "succeeded_last_hour"),
    ("FAILED 1H", "failed_last_hour"),
)


def format_age(seconds: float) -> str:
    """``0s``, ``42s``, ``3m05s``, ``2h07m``, ``3d04h``: short and sortable by eye."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _cell(field: str, value: Any) -> str:
    if field == "oldest_age_seconds":
        return format_age(float(value))
    if field == "paused":
        return "paused" if value else "-"
    return str(value)


def render_table(rows: list[QueueStats]) -> str:
    """The queues as a fixed-width text table, with a total line when there are several."""
    cells = []
    for stats in rows:
        line = []
        for _, field in _COLUMNS:
            value = getattr(stats, field)
            line.append(_cell(field, value))
        cells.append(line)
    if len(rows) > 1:
        total = ["(all)"]
        for _, field in _COLUMNS[1:]:
            values = [getattr(stats, field) or 0 for stats in rows]
            if field == "paused":
                total.append(str(sum(values)))  # how many queues are paused
            else:
                total.append(format_age(max(values)) if field == "oldest_age_seconds" else str(sum(values)))
        cells.append(total)
    headers = [header for header, _ in _COLUMNS]
    widths = [max(len(headers[i]), *(len(line[i]) for line in cells)) for i in range(len(headers))]

    def fmt(line: list[str]) -> str:
        first = line[0].ljust(widths[0])
        rest = (value.rjust(width) for value, width in zip(line[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return "\n".join([fmt(headers), *(fmt(line) for line in cells)]) + "\n"


def render_schedules(rows: list[ScheduleStats]) -> str:
    """The schedules as a fixed-width text table (removed ones marked, so they are noticed)."""
    headers = ["SCHEDULE", "STATE", "CRON", "NEXT TICK", "LAST TICK", "LAST JOB"]

    def when(value: Any) -> str:
        return f"{value:%Y-%m-%d %H:%M:%S}" if value is not None else "-"

    cells = [
        [
            row.name,
            row.state.upper() if row.state == "removed" else row.state,
            f"{row.cron} ({row.timezone})",
            when(row.next_tick_at),
            when(row.last_tick_at),
            f"#{row.last_job_id} {row.last_job_status}" if row.last_job_id is not None else "-",
        ]
        for row in rows
    ]
    widths = [max(len(headers[i]), *(len(line[i]) for line in cells)) for i in range(len(headers))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
        for line in [headers, *cells]
    ]
    return "\n".join(lines) + "\n"


def render_limits(rows: list[LimitStats]) -> str:
    """The flow-control limits as a fixed-width text table."""
    headers = ["LIMIT", "KIND", "BOUND", "RUNNING", "FULL KEYS", "WAITING"]
    cells = [
        [row.limit, row.kind, row.bound, str(row.running), str(row.full_keys), str(row.waiting)]
        for row in rows
    ]
    widths = [max(len(headers[i]), *(len(line[i]) for line in cells)) for i in range(len(headers))]
    lines = [
        "  ".join(
            v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in [headers, *cells]
    ]
    return "\n".join(lines) + "\n"


def render_event_loops(rows: list[EventLoopStats]) -> str:
    """The workers' event loops (``--async-slots``): slots in use and lag, at their last beat."""
    head = ("WORKER", "SLOTS IN USE", "LOOP LAG")
    cells = [(row.worker_id, f"{row.in_use}/{row.slots}", f"{row.lag_ms}ms") for row in rows]
    widths = [max(len(line[i]) for line in [head, *cells]) for i in range(len(head))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in [head, *cells]
    ]
    return "\n".join(lines) + "\n"


def render_breakers(rows: list[BreakerStats]) -> str:
    """The breakers and retry budgets of the named limits as a fixed-width text table."""
    headers = ["BREAKER", "STATE", "CALLS", "FAILED", "OPENS IN", "RETRIES", "BUDGET LEFT", "WAITING"]
    cells = [
        [
            row.limit,
            row.state.replace("_", "-") + (" (by hand)" if row.manual else "") if row.breaker else "-",
            str(row.calls),
            str(row.failures),
            f"{row.opens_in:.0f}s" if row.opens_in is not None else "-",
            str(row.retries),
            str(row.budget_remaining) if row.budget_remaining is not None else "-",
            str(row.waiting),
        ]
        for row in rows
    ]
    widths = [max(len(headers[i]), *(len(line[i]) for line in cells)) for i in range(len(headers))]
    lines = [
        "  ".join(
            v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in [headers, *cells]
    ]
    return "\n".join(lines) + "\n"


def render_outbox(rows: list[DestinationStats], held: list[HeldKey]) -> str:
    """The outbox destinations as a fixed-width text table, then each held key with its blocking message."""
    headers = ["DESTINATION", "ON FAILURE", "PENDING", "OLDEST UNDELIVERED", "HELD KEYS", "DEAD"]
    cells = [
        [
            row.destination,
            row.on_failure if row.declared else "NOT DECLARED",
            str(row.pending),
            format_age(row.oldest_age_seconds),
            str(row.held_keys),
            str(row.dead),
        ]
        for row in rows
    ]
    widths = [max(len(headers[i]), *(len(line[i]) for line in cells)) for i in range(len(headers))]
    lines = [
        "  ".join(
            v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in [headers, *cells]
    ]
    for key in held:
        error = key.last_error.splitlines()[0] if key.last_error else "no error recorded"
        lines.append(
            f"held: {key.destination} key {key.key!r} by message #{key.message_pk} (seq {key.seq}, "
            f"id {key.message_id}), dead after {key.attempts} attempt(s), published "
            f"{format_age(key.age_seconds)} ago, {key.waiting} waiting behind it: {error}"
        )
    shown = sum(row.held_keys for row in rows)
    if held:
        more = f" ({shown - len(held)} more not listed)" if shown > len(held) else ""
        lines.append(
            "replay or skip a held key's message in the admin (Outbox messages, filter 'holds its key')"
            f"{more}: see docs/runbooks/held-outbox-key.md"
        )
    late = [row.destination for row in rows if row.pending and row.oldest_age_seconds >= warn_after()]
    if late:
        lines.append(
            f"undelivered for more than {format_age(warn_after())}: "
            f"{', '.join(late)}: see docs/runbooks/outbox-lag.md"
        )
    return "\n".join(lines) + "\n"


class Command(BaseCommand):
    help = (
        "Show each queue: jobs due (depth), scheduled and in flight, the oldest due job's age, "
        "dead letters, replays awaiting approval, whether it is paused, and successes/failures in "
        "the last hour; then each schedule: its state, next and last tick, and the last tick's job; "
        "then each flow-control limit: its bound, the jobs running under it, its full keys and the "
        "due jobs waiting on it; then each circuit breaker and retry budget: its state, its window's "
        "calls and failures, the retries it still allows and the jobs waiting behind it; then each "
        "live worker with async slots: slots in use and its event loop's lag; then each outbox "
        "destination: messages pending, the oldest undelivered one's age, the keys a dead message "
        "holds and the dead messages, and each held key with its blocking message. On PostgreSQL, a "
        "line above the table names what has held the vacuum horizon past JOBGUARD['HORIZON']['WARN_AFTER']."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON for scripts instead of a table.")
        parser.add_argument(
            "--watch",
            nargs="?",
            type=positive_float,
            const=DEFAULT_WATCH_INTERVAL_SECONDS,
            default=None,
            metavar="SECONDS",
            help=(
                "Refresh every SECONDS (default "
                f"{DEFAULT_WATCH_INTERVAL_SECONDS:g}) until interrupted; with --json, one JSON "
                "document per line."
            ),
        )
        parser.add_argument(
            "--count",
            type=positive_int,
            default=None,
            help="With --watch: stop after this many refreshes.",
        )
        parser.add_argument(
            "--queue",
            "-q",
            action="append",
            dest="queues",
            metavar="QUEUE",
            help="Show only this queue; repeat for several. Default: every queue.",
        )
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["count"] is not None and options["watch"] is None:
            raise CommandError("--count only applies with --watch.")
        alias = database_alias(options)
        check_queues(options["queues"] or (), alias)
        watch = options["watch"]
        shown = 0
        try:
            while True:
                rows = queue_stats(alias, recent=True, queues=options["queues"])
                timetable = schedule_stats(alias)
                limits = limit_stats(alias)
                loops = event_loop_stats(alias, live_within=STALE_AFTER_SECONDS)
                guards = breaker_stats(alias)
                horizon = horizon_holds(alias)
                outbox = destination_stats() if get_settings().outbox.destinations else []
                held = held_keys() if any(row.held_keys for row in outbox) else []
                self._show(
                    rows,
                    timetable,
                    limits,
                    worker_health(alias),
                    loops,
                    guards,
                    horizon,
                    outbox,
                    held,
                    as_json=options["json"],
                    clear=watch is not None and not options["json"],
                )
                shown += 1
                if watch is None or (options["count"] is not None and shown >= options["count"]):
                    return
                time.sleep(watch)
        except KeyboardInterrupt:
            return

    def _show(
        self,
        rows: list[QueueStats],
        timetable: list[ScheduleStats],
        limits: list[LimitStats],
        workers: dict[str, Any],
        loops: list[EventLoopStats],
        guards: list[BreakerStats],
        horizon: list[HorizonHold],
        outbox: list[DestinationStats],
        held: list[HeldKey],
        *,
        as_json: bool,
        clear: bool,
    ) -> None:
        now = timezone.now()
        if as_json:
            document = {
                "generated_at": now.isoformat(),
                "queues": [stats.as_dict() for stats in rows],
                "schedules": [schedule.as_dict() for schedule in timetable],
                "limits": [limit.as_dict() for limit in limits],
                "workers": workers,
                "event_loops": [loop.as_dict() for loop in loops],
                "breakers": [guard.as_dict() for guard in guards],
                "vacuum_horizon": [
                    {**{k: v for k, v in hold.holder.as_dict().items() if k != "query"}, "text": hold.text}
                    for hold in horizon
                ],
                "outbox": {
                    "destinations": [row.as_dict() for row in outbox],
                    "held_keys": [key.as_dict() for key in held],
                },
            }
            self.stdout.write(json.dumps(document, sort_keys=True))
            return
        if clear and self.stdout.isatty():
            self.stdout.write("\x1b[H\x1b[2J", ending="")
        stale = workers["stale"]
        summary = f"workers: {len(workers['live'])} live"
        if stale:
            names = ", ".join(f"{w['worker_id']} ({w['seconds_since_beat']}s)" for w in stale)
            summary += f", {len(stale)} not beating (killed, frozen or cut off from the database): {names}"
        self.stdout.write(f"jobguard queues at {now:%Y-%m-%d %H:%M:%S %Z}; {summary}")
        for hold in horizon:
            self.stdout.write(f"{hold.text}: see docs/runbooks/{hold.runbook}.md")
        self.stdout.write(render_table(rows), ending="")
        if timetable:
            self.stdout.write("")
            self.stdout.write(render_schedules(timetable), ending="")
            removed = [row.name for row in timetable if row.state == "removed"]
            if removed:
                self.stdout.write(
                    f"{len(removed)} schedule(s) no longer declared and not running: {', '.join(removed)}"
                )
        if limits:
            self.stdout.write("")
            self.stdout.write(render_limits(limits), ending="")
        if guards:
            self.stdout.write("")
            self.stdout.write(render_breakers(guards), ending="")
        if loops:
            self.stdout.write("")
            self.stdout.write(render_event_loops(loops), ending="")
        if outbox:
            self.stdout.write("")
            self.stdout.write(render_outbox(outbox, held), ending="")
