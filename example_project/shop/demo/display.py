"""What the demo shows while it runs: rich progress bars on a terminal, plain lines elsewhere (CI)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from django.db.models import Count, Q, Sum
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from django_jobguard.models import IdempotencyKey, Job, JobStatus

#: Seconds between two plain progress lines when the output is not a terminal.
PLAIN_EVERY_SECONDS = 2.0


@dataclasses.dataclass
class Snapshot:
    """The figures the display shows, read from the database in three queries."""

    queues: dict[str, dict[str, int]]
    succeeded: int = 0
    dead: int = 0
    retried: int = 0
    contentions: int = 0
    reappeared: int = 0
    duplicates: int = 0

    @property
    def unfinished(self) -> int:
        return sum(q["queued"] + q["running"] for q in self.queues.values())


def snapshot() -> Snapshot:
    by_queue: dict[str, dict[str, int]] = {}
    for row in Job.objects.values("queue_name", "status").annotate(n=Count("id")):
        counts = by_queue.setdefault(row["queue_name"], dict.fromkeys(JobStatus.values, 0))
        counts[row["status"]] = row["n"]
    figures = Job.objects.aggregate(
        total_attempts=Sum("attempts"),
        # A job that has started its last attempt (running or finished) counts one attempt
        # that was not a retry; a reappearance (lease expired) is not a retry either.
        started=Count("id", filter=Q(attempts__gt=0) & ~Q(status=JobStatus.QUEUED)),
        total_contentions=Sum("lock_contentions"),
        total_reappearances=Sum("reappearances"),
    )
    shot = Snapshot(queues=dict(sorted(by_queue.items())))
    shot.succeeded = sum(q[JobStatus.SUCCEEDED] for q in by_queue.values())
    shot.dead = sum(q[JobStatus.DEAD] for q in by_queue.values())
    shot.reappeared = figures["total_reappearances"] or 0
    shot.retried = (figures["total_attempts"] or 0) - figures["started"] - shot.reappeared
    shot.contentions = figures["total_contentions"] or 0
    shot.duplicates = IdempotencyKey.objects.aggregate(s=Sum("duplicates"))["s"] or 0
    return shot


def enqueue_duplicates_counted() -> float | None:
    """This process's ``jobguard_idempotency_duplicates_total{where="enqueue"}``, summed over tasks.

    None without prometheus-client. The demo process does all the enqueueing, so this counter
    and the keys' ``duplicates`` column must agree.
    """
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return None
    total = 0.0
    for family in REGISTRY.collect():
        if family.name == "jobguard_idempotency_duplicates":
            total += sum(
                s.value
                for s in family.samples
                if s.name.endswith("_total") and s.labels.get("where") == "enqueue"
            )
    return total


def _counters(shot: Snapshot, notes: list[str]) -> Group:
    table = Table.grid(padding=(0, 3))
    for _ in range(6):
        table.add_column(justify="right")
    table.add_row(
        "[green]succeeded",
        "[yellow]retried",
        "[red]dead",
        "[cyan]lock contentions",
        "[magenta]duplicates stopped",
        "[blue]reappeared",
    )
    table.add_row(
        *(
            str(v)
            for v in (
                shot.succeeded,
                shot.retried,
                shot.dead,
                shot.contentions,
                shot.duplicates,
                shot.reappeared,
            )
        )
    )
    return Group(table, *(f"[dim]{note}" for note in notes[-3:]))


class Display:
    """Call :meth:`update` with fresh snapshots; a context manager around the live area."""

    def __init__(self, console: Console, queues: list[str]) -> None:
        self.console = console
        self.live_mode = console.is_terminal
        self.notes: list[str] = []
        self.started = time.monotonic()
        self._last_plain = 0.0
        self.progress = Progress(
            TextColumn("{task.description:<11}"),
            BarColumn(bar_width=36),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            console=console,
            auto_refresh=False,
        )
        # One bar per declared queue, in the settings' order, before their first job arrives.
        self._tasks: dict[str, Any] = {
            queue: self.progress.add_task(queue, total=0, detail="") for queue in queues
        }
        self._live: Live | None = None
        self._shot = Snapshot(queues={})

    def __enter__(self) -> Display:
        if self.live_mode:
            self._live = Live(self._renderable(), console=self.console, refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self._renderable())
            self._live.__exit__(None, None, None)
        else:
            self._plain(force=True)

    def note(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        self.notes.append(f"{elapsed:5.1f}s  {text}")
        if not self.live_mode:
            self.console.print(self.notes[-1], highlight=False)

    def update(self, shot: Snapshot) -> None:
        self._shot = shot
        for queue, counts in shot.queues.items():
            total = sum(counts.values())
            finished = counts[JobStatus.SUCCEEDED] + counts[JobStatus.DEAD] + counts[JobStatus.CANCELLED]
            detail = f"running {counts[JobStatus.RUNNING]}" + (
                f", [red]dead {counts[JobStatus.DEAD]}" if counts[JobStatus.DEAD] else ""
            )
            if queue not in self._tasks:
                self._tasks[queue] = self.progress.add_task(queue, total=total, detail=detail)
            self.progress.update(self._tasks[queue], total=total, completed=finished, detail=detail)
        if self._live is not None:
            self._live.update(self._renderable())
        else:
            self._plain()

    def _renderable(self) -> Any:
        return Group(self.progress, "", _counters(self._shot, self.notes))

    def _plain(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_plain < PLAIN_EVERY_SECONDS:
            return
        self._last_plain = now
        shot = self._shot
        queues = "  ".join(
            f"{queue} {c[JobStatus.SUCCEEDED] + c[JobStatus.DEAD]}/{sum(c.values())}"
            for queue, c in shot.queues.items()
        )
        self.console.print(
            f"{now - self.started:5.1f}s  {queues}  | succeeded={shot.succeeded} retried={shot.retried} "
            f"dead={shot.dead} lock_contentions={shot.contentions} duplicates_stopped={shot.duplicates} "
            f"reappeared={shot.reappeared}",
            highlight=False,
            soft_wrap=True,
        )
