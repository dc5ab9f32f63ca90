"""``manage.py jobguard_worker``: parse and validate options, then run a Worker."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...checks.tasks import WORKER_START_TAG
from ...conf import WORKER_ID_MAX_LENGTH
from ...monitoring import metrics
from ...worker import Worker
from ._options import (
    add_database_argument,
    check_queues,
    database_alias,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)


class Command(BaseCommand):
    help = "Run jobs: claim due jobs of the given queues with leases, heartbeat them, and ack or retry them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            "-q",
            action="append",
            dest="queues",
            metavar="QUEUE",
            help="Queue to take jobs from; repeat for several. Default: every queue.",
        )
        parser.add_argument(
            "--concurrency",
            "-c",
            type=non_negative_int,
            default=1,
            help=(
                "Jobs run at once, each in its own thread with its own database connection (default 1). "
                "0 only with --async-slots: an async-only worker, which puts sync tasks back for others."
            ),
        )
        parser.add_argument(
            "--async-slots",
            type=positive_int,
            default=None,
            metavar="N",
            help=(
                "Run async def tasks as coroutines on one event loop, up to N at once, with a few "
                "database connections for all of them; sync tasks still run on the --concurrency "
                "threads. Default: off (async def tasks take a thread each)."
            ),
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=None,
            help=(
                "Most jobs held (claimed) at once, taken in one round trip (default: twice "
                "--concurrency, more for short jobs, up to 64; fewer for jobs over a second)."
            ),
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Run the jobs that are due, then exit with a one-line summary on stdout (no scheduler).",
        )
        parser.add_argument(
            "--no-schedule",
            action="store_false",
            dest="schedule",
            help="Do not run the scheduler here (recurring jobs are enqueued by the other workers).",
        )
        parser.add_argument(
            "--max-jobs",
            type=positive_int,
            default=None,
            help="Exit after claiming this many jobs (a supervisor restarts the worker).",
        )
        parser.add_argument(
            "--worker-id", default=None, help="Name in job rows and logs (default host:pid:random)."
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_float,
            default=None,
            help="Seconds between polls when idle (default JOBGUARD['POLL_INTERVAL']).",
        )
        parser.add_argument(
            "--reaper-interval",
            type=positive_float,
            default=None,
            help="Seconds between passes over expired leases (default JOBGUARD['REAPER_INTERVAL']).",
        )
        parser.add_argument(
            "--shutdown-grace",
            type=non_negative_float,
            default=None,
            help=(
                "Seconds running jobs get after SIGTERM before they are handed back "
                "(default JOBGUARD['SHUTDOWN_GRACE'])."
            ),
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            metavar="PORT",
            help=(
                "Serve this worker's Prometheus metrics (counters and durations, not the queue "
                "gauges) over HTTP on PORT. Needs the metrics extra."
            ),
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            metavar="ADDR",
            help=(
                "Address the metrics server listens on (default 127.0.0.1, this host only; give "
                "0.0.0.0 or the pod's address for a scraper on another host)."
            ),
        )
        add_database_argument(parser)
        _add_db_worker_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        queues = options["queues"]
        queues, exclude_queues = _db_worker_queues(queues, options)
        check_queues(queues or (), database_alias(options))
        if options["concurrency"] == 0 and options["async_slots"] is None:
            raise CommandError(
                "--concurrency 0 leaves no thread to run jobs on: give --async-slots N as well "
                "(an async-only worker), or a concurrency of 1 or more."
            )
        port = options["metrics_port"]
        if port is not None and not 0 <= port <= 65535:
            raise CommandError(f"--metrics-port {port}: a port is 0 to 65535.")
        _check_worker_id(options["worker_id"])
        if not options["skip_checks"]:
            # The checklist's warnings that other commands leave to `check --deploy` (W003).
            self.check(tags=[WORKER_START_TAG], include_deployment_checks=True)
            _report_missing_keys(database_alias(options))
        if options["verbosity"] >= 2:
            logging.getLogger("django_jobguard").setLevel(logging.DEBUG)
        worker = Worker(
            queues=queues,
            exclude_queues=exclude_queues,
            concurrency=options["concurrency"],
            async_slots=options["async_slots"],
            batch_size=options["batch_size"],
            burst=options["burst"],
            max_jobs=options["max_jobs"],
            worker_id=options["worker_id"],
            database_alias=database_alias(options),
            poll_interval=options["poll_interval"],
            reaper_interval=options["reaper_interval"],
            shutdown_grace=options["shutdown_grace"],
            run_scheduler=options["schedule"],
        )
        if not worker.schema_present(migrations=True):
            raise SystemExit(worker.exit_code)  # not migrated, or not since an upgrade: said why
        server = None
        if port is not None:
            try:
                server = metrics.serve_worker_metrics(port, options["metrics_addr"])
            except (OSError, RuntimeError) as exc:
                raise CommandError(f"--metrics-port {port}: {exc}") from exc
            logging.getLogger("django_jobguard.worker").info(
                "metrics_serving worker_id=%s addr=%s port=%d",
                worker.worker_id,
                server.addr,
                server.port,
                extra={"worker_id": worker.worker_id},
            )
        try:
            code = worker.run()
        finally:
            if server is not None:
                server.close()
        if options["burst"]:
            # Logging may be quiet (WARNING by default): say what the burst did on stdout.
            self.stdout.write(f"jobguard_worker --burst: {worker.summary()}")
        if code:
            raise SystemExit(code)


# -- django-tasks-db's db_worker flags, so moving over is a command rename ---------------------


def _add_db_worker_arguments(parser: CommandParser) -> None:
    """The ``db_worker`` flags that make sense here, as aliases of jobguard's own."""
    group = parser.add_argument_group("django-tasks-db db_worker flags")
    group.add_argument(
        "--queue-name",
        default=None,
        metavar="NAMES",
        help="Queues to take jobs from, separated by commas; '*' for every queue (db_worker's flag).",
    )
    group.add_argument(
        "--exclude-queues",
        default=None,
        metavar="NAMES",
        help="Queues never to take jobs from, separated by commas (db_worker's flag).",
    )
    group.add_argument(
        "--interval",
        dest="poll_interval",
        type=positive_float,
        metavar="SECONDS",
        help="Same as --poll-interval (db_worker's flag).",
    )
    group.add_argument(
        "--batch", dest="burst", action="store_true", help="Same as --burst (db_worker's flag)."
    )
    group.add_argument(
        "--max-tasks",
        dest="max_jobs",
        type=positive_int,
        metavar="N",
        help="Same as --max-jobs (db_worker's flag).",
    )


def _names(flag: str, value: str) -> list[str]:
    names = [name.strip() for name in value.split(",")]
    for name in names:
        if not name or len(name) > 100:
            raise CommandError(f"{flag} {value!r}: each queue name is 1 to 100 characters.")
    return names


def _check_worker_id(worker_id: str | None) -> None:
    """``--worker-id``: every claim writes it into the job rows, so it must fit their column."""
    if worker_id is None:
        return
    if len(worker_id) > WORKER_ID_MAX_LENGTH:
        raise CommandError(
            f"--worker-id is {len(worker_id)} characters long; a worker id may have at most "
            f"{WORKER_ID_MAX_LENGTH} (the worker_id column of the job rows): {worker_id[:40]!r}..."
        )
    if "\x00" in worker_id:
        raise CommandError("--worker-id holds a NUL character (\\x00), which the database cannot store.")


def _db_worker_queues(
    queues: list[str] | None, options: dict[str, Any]
) -> tuple[list[str] | None, list[str]]:
    """``--queue`` plus ``--queue-name`` (None: every queue), and the ``--exclude-queues``."""
    exclude = _names("--exclude-queues", options["exclude_queues"]) if options["exclude_queues"] else []
    value = options["queue_name"]
    if value is None:
        selected = queues
    elif value.strip() == "*":
        selected = None
    else:
        selected = [*(queues or []), *_names("--queue-name", value)]
    if selected is not None and not [name for name in selected if name not in exclude]:
        raise CommandError("--exclude-queues leaves no queue to take jobs from.")
    return selected, exclude


def _report_missing_keys(alias: str) -> None:
    """Say at start, as an error, that stored values name a key this worker lacks (jobguard.E081).

    The worker still starts: it dead-letters each job it cannot decrypt, naming the key, with
    its payload intact, and runs the others; refusing to start would stop every queue over one
    lost key. ``migrate`` and ``check --database`` refuse on the same check.
    """
    from ...checks.encryption import check_stored_keys

    for message in check_stored_keys(databases=[alias]):
        if message.id == "jobguard.E081":
            logging.getLogger("django_jobguard.worker").error(
                "encryption_key_missing check=%s %s HINT: %s", message.id, message.msg, message.hint
            )
