"""What waking workers costs the application's commits: each ``JOBGUARD["NOTIFY"]`` mode against
no wake-up at all.

A PostgreSQL transaction that has called NOTIFY takes one lock of the whole server as it
commits, held until its commit is flushed, so notifying commits run one at a time. This
benchmark has ``--clients`` threads (spread over ``--processes`` processes) each commit
single-job enqueue transactions (``with transaction.atomic(): noop.enqueue(i)``) as fast as
they can for ``--seconds``, after ``--warmup``, with a connection LISTENing on the channel as
idle workers do, once per mode:

- ``baseline``: the jobs' NOTIFY triggers disabled and nothing sent by the application;
- ``row``: a trigger notifies in every enqueuing transaction;
- ``coalesced``: the enqueuing process notifies after the commit, at most once per queue per
  ``--interval`` (NOTIFY_INTERVAL), in a statement of its own;
- ``none``: the triggers on but notifying nothing (what is left is their cost).

Reported per mode, medians of ``--runs`` (the modes interleaved, their order rotated each
round): commits/s, the commit's p50 and p99 (COMMIT and the commit hooks, what
``atomic()``'s exit costs) and the whole transaction's p99, and the NOTIFYs the listener heard
per second. "vs base" is the median over rounds of each round's ratio to that round's baseline
(the pair shares the machine's load of the moment). Load (``uptime``) before and after. The
client processes are started once and kept for every run.

    .venv/bin/python benchmarks/bench_notify.py                      # a cluster of its own
    .venv/bin/python benchmarks/bench_notify.py --runs 1 --seconds 5 --modes baseline,row
    .venv/bin/python benchmarks/bench_notify.py --pgbench --runs 3 --seconds 8  # the server alone
    .venv/bin/python benchmarks/bench_notify.py --pg-url postgres://postgres@127.0.0.1:5432/jg_notify

``--pgbench`` measures the server's side alone: ``--clients`` pgbench clients send the ``INSERT``
an enqueue sends (no Python in the way), and for "coalesced" ``--processes`` more sessions send
the NOTIFY statement of ``django_jobguard.store.wakeup`` at the most the processes' threads
would (one per ``--interval`` each).

By default it runs on a PostgreSQL cluster it creates for itself in a temporary directory
(``initdb``; as root through ``runuser -u postgres``), with the server's defaults (fsync and
``synchronous_commit`` on) but ``max_connections`` 200: the lock is the cluster's, so another
project's notifying commits on a shared server would land in the figures. ``--pg-url`` uses an
existing server's database instead (created if missing, emptied before each run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODES = ("baseline", "row", "coalesced", "none")
CHANNEL = "jobguard_jobs"
#: Where the benchmark's own cluster listens (the first free port from here up).
PORTS = range(5490, 5500)
TRIGGERS = ("jobguard_job_queued_notify", "jobguard_job_requeued_notify")


# -- the client processes ----------------------------------------------------------------------


def client(args: argparse.Namespace) -> None:
    """One process of ``--threads`` clients, kept for every run.

    Reads ``<mode> <start time>`` lines on stdin; for each, its threads enqueue from the start
    time for ``--warmup`` + ``--seconds`` under that mode, and one JSON line of the measured
    latencies goes to stdout. Kept between runs so that no run pays for starting Django.
    """
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.jobguard_settings")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection, transaction
    from django.test.utils import override_settings

    from benchmarks.jobguard_app.tasks import noop

    results: list[tuple[list[float], list[float]]] = []
    go = threading.Barrier(args.threads + 1)
    done = threading.Barrier(args.threads + 1)
    start = [0.0]

    def run(index: int) -> None:
        connection.ensure_connection()
        i = index * 100_000_000
        while True:
            go.wait()
            if start[0] < 0:
                break
            begin, end = start[0] + args.warmup, start[0] + args.warmup + args.seconds
            commits: list[float] = []
            transactions: list[float] = []
            while time.time() < start[0]:
                time.sleep(0.001)
            while True:
                t0 = time.perf_counter()
                with transaction.atomic():
                    noop.enqueue(i)
                    t1 = time.perf_counter()
                t2 = time.perf_counter()
                i += 1
                now = time.time()
                if now >= end:
                    break
                if now >= begin:
                    commits.append(t2 - t1)
                    transactions.append(t2 - t0)
            results.append((commits, transactions))
            done.wait()
        connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(args.threads)]
    for thread in threads:
        thread.start()
    print("ready", flush=True)
    for line in sys.stdin:
        mode, at = line.split()
        with override_settings(
            JOBGUARD={**settings.JOBGUARD, "NOTIFY": "none" if mode == "baseline" else mode}
        ):
            results.clear()
            start[0] = float(at)
            go.wait()
            done.wait()
        print(
            json.dumps(
                {
                    "commit": [x for c, _ in results for x in c],
                    "transaction": [x for _, t in results for x in t],
                }
            ),
            flush=True,
        )
    start[0] = -1.0
    go.wait()
    for thread in threads:
        thread.join()


class Clients:
    """The client processes, started once."""

    def __init__(self, args: argparse.Namespace, url: str) -> None:
        per_process = [
            args.clients // args.processes + (n < args.clients % args.processes)
            for n in range(args.processes)
        ]
        command = [
            sys.executable,
            __file__,
            "--client",
            "--warmup",
            str(args.warmup),
            "--seconds",
            str(args.seconds),
        ]
        self.procs = [
            subprocess.Popen(
                [*command, "--threads", str(threads)],
                cwd=ROOT,
                env=_env(url, "none", args.interval),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for threads in per_process
        ]
        for proc in self.procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit("a client process did not start")

    def run(self, mode: str, start: float) -> tuple[list[float], list[float]]:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{mode} {start}\n")
            proc.stdin.flush()
        commits: list[float] = []
        transactions: list[float] = []
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"a client process failed in {mode}")
            figures = json.loads(line)
            commits += figures["commit"]
            transactions += figures["transaction"]
        return commits, transactions

    def close(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in self.procs:
            proc.wait(timeout=60)


class PgbenchClients:
    """``--pgbench``: the server's side alone. ``--clients`` pgbench clients send the ``INSERT``
    of an enqueue (one row, autocommitted); for "coalesced", ``--processes`` more sessions send
    the NOTIFY statement of django_jobguard.store.wakeup at the most its threads would send
    (``--processes`` / ``--interval`` a second)."""

    def __init__(self, args: argparse.Namespace, url: str, conninfo: str) -> None:
        import psycopg

        from benchmarks._common import django_database

        self.args = args
        db = django_database(url)
        self.target = [
            "-h",
            db["HOST"],
            "-p",
            db["PORT"] or "5432",
            "-U",
            db["USER"] or "postgres",
            db["NAME"],
        ]
        self.dir = Path(tempfile.mkdtemp(prefix="jobguard-notify-pgbench-"))
        with psycopg.connect(conninfo, autocommit=True) as conn:
            columns = conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = "
                "'jobguard_job' AND is_nullable = 'NO' AND column_default IS NULL AND column_name <> 'id'"
            ).fetchall()
        literal = {
            "jsonb": "'[]'",
            "double precision": "60",
            "boolean": "false",
            "timestamp with time zone": "now()",
        }
        special = {
            "queue_name": "'default'",
            "status": "'queued'",
            "kwargs": "'{}'",
            "task_name": "'bench.noop'",
        }
        values = [
            special.get(name) or literal.get(kind) or ("0" if "int" in kind else "''")
            for name, kind in columns
        ]
        (self.dir / "insert.sql").write_text(
            f"INSERT INTO jobguard_job ({', '.join(name for name, _ in columns)}) "
            f"VALUES ({', '.join(values)});\n"
        )
        (self.dir / "notify.sql").write_text(
            "SELECT set_config('synchronous_commit', 'off', true), pg_notify('jobguard_jobs', 'default');\n"
        )

    def run(self, mode: str, start: float) -> tuple[list[float], list[float]]:
        args, pgbench = self.args, _bin("pgbench")
        length = str(int(args.warmup + args.seconds + 1))
        side = None
        if mode == "coalesced":
            rate = str(int(args.processes / args.interval))
            side = subprocess.Popen(
                [
                    pgbench,
                    "-n",
                    "-c",
                    str(args.processes),
                    "-R",
                    rate,
                    "-T",
                    length,
                    "-f",
                    "notify.sql",
                    *self.target,
                ],
                cwd=self.dir,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        for old in self.dir.glob("log*"):
            old.unlink()
        begin = time.time() + args.warmup
        subprocess.run(
            [
                pgbench,
                "-n",
                "-c",
                str(args.clients),
                "-j",
                "2",
                "-T",
                length,
                "-l",
                "--log-prefix",
                "log",
                "-f",
                "insert.sql",
                *self.target,
            ],
            cwd=self.dir,
            capture_output=True,
            check=True,
        )
        if side is not None:
            side.wait()
        latencies = []
        for log in self.dir.glob("log*"):
            for line in log.read_text().splitlines():
                fields = line.split()  # client, transaction, latency (us), script, epoch s, epoch us
                at = int(fields[4]) + int(fields[5]) / 1e6
                if begin <= at < begin + args.seconds:
                    latencies.append(int(fields[2]) / 1e6)
        return latencies, latencies

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


# -- the server ----------------------------------------------------------------------------------


def _as_postgres(command: list[str]) -> list[str]:
    # initdb refuses to run as root.
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: int(p.parts[4]))
    return str(found[-1]) if found else (shutil.which(name) or name)


def _free_port() -> int:
    for port in PORTS:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit(f"no free port in {PORTS.start}-{PORTS.stop - 1}")


@contextlib.contextmanager
def own_cluster() -> Iterator[str]:
    """A PostgreSQL cluster in a temporary directory for the run; its database's URL."""
    root = Path(tempfile.mkdtemp(prefix="jobguard-notify-"))
    data, port = root / "data", _free_port()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    subprocess.run(
        _as_postgres([_bin("initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"]),
        check=True,
        capture_output=True,
    )
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(
            f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{root}'\n"
            "max_connections = 200\nshared_buffers = '256MB'\nmax_wal_size = '4GB'\n"
        )
    log = root / "server.log"
    subprocess.run(
        _as_postgres([_bin("pg_ctl"), "-D", str(data), "-l", str(log), "-w", "start"]),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgres://postgres@127.0.0.1:{port}/jg_notify"
    finally:
        subprocess.run(
            _as_postgres([_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]), capture_output=True
        )
        shutil.rmtree(root, ignore_errors=True)


def migrate(url: str) -> None:
    from benchmarks._database import create_if_missing

    create_if_missing(url)
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0", "--skip-checks"],
        cwd=ROOT,
        env=_env(url, "none", 0.05),
        check=True,
    )


def _env(url: str, notify: str, interval: float) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.jobguard_settings"
    env["BENCH_DATABASE_URL"] = url
    env["BENCH_JOBGUARD"] = json.dumps({"NOTIFY": notify, "NOTIFY_INTERVAL": interval})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def prepare(conninfo: str, mode: str) -> None:
    """Empty the jobs, put the triggers in ``mode``'s state, and checkpoint."""
    import psycopg

    installed = "none" if mode == "baseline" else mode
    toggle = "DISABLE" if mode == "baseline" else "ENABLE"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("TRUNCATE jobguard_job CASCADE")
        # As django_jobguard.store.wakeup installs it (migrate would, with this mode set).
        conn.execute(
            "CREATE OR REPLACE FUNCTION jobguard_notify_mode() RETURNS text "
            f"LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '{installed}'::text $$"
        )
        conn.execute(f"ALTER TABLE jobguard_job {', '.join(f'{toggle} TRIGGER {t}' for t in TRIGGERS)}")
        conn.execute("CHECKPOINT")


class Heard:
    """A LISTENing connection, as idle workers hold: counts the NOTIFYs delivered to it."""

    def __init__(self, conninfo: str) -> None:
        import psycopg

        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.conn.execute(f"LISTEN {CHANNEL}")
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for _ in self.conn.notifies(timeout=0.2):
                self.times.append(time.time())

    def between(self, begin: float, end: float) -> int:
        return sum(begin <= t < end for t in list(self.times))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.conn.close()


# -- one run -----------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def one_run(
    args: argparse.Namespace, clients: Clients, conninfo: str, mode: str, heard: Heard
) -> dict[str, float]:
    prepare(conninfo, mode)
    start = time.time() + 0.2
    commits, transactions = clients.run(mode, start)
    begin = start + args.warmup
    return {
        "commits_per_second": len(commits) / args.seconds,
        "commit_p50_ms": percentile(commits, 0.50) * 1000,
        "commit_p99_ms": percentile(commits, 0.99) * 1000,
        "transaction_p99_ms": percentile(transactions, 0.99) * 1000,
        "notifies_per_second": heard.between(begin, begin + args.seconds) / args.seconds,
    }


# -- the table --------------------------------------------------------------------------------------


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def paired(runs: dict[str, list[dict[str, float]]], mode: str, key: str) -> float | None:
    """The median over rounds of ``mode``'s figure against the baseline's of the same round.

    Each round runs every mode within a minute, so the pair shares the machine's load of that
    moment; a median of the per-round ratios is steadier than a ratio of the medians.
    """
    if "baseline" not in runs or mode == "baseline":
        return None
    return statistics.median(
        run[key] / base[key] for run, base in zip(runs[mode], runs["baseline"], strict=True) if base[key]
    )


def report(
    medians: dict[str, dict[str, float]], runs: dict[str, list[dict[str, float]]], args: argparse.Namespace
) -> str:
    def versus(mode: str, key: str) -> str:
        ratio = paired(runs, mode, key)
        return "" if ratio is None else f"{(ratio - 1) * 100:+.1f} %"

    headers = [
        "mode",
        "commits/s",
        "vs base",
        "commit p50 ms",
        "commit p99 ms",
        "vs base",
        "txn p99 ms",
        "NOTIFY/s",
    ]
    rows = [
        [
            mode,
            f"{m['commits_per_second']:.0f}",
            versus(mode, "commits_per_second"),
            f"{m['commit_p50_ms']:.2f}",
            f"{m['commit_p99_ms']:.2f}",
            versus(mode, "commit_p99_ms"),
            f"{m['transaction_p99_ms']:.2f}",
            f"{m['notifies_per_second']:.0f}",
        ]
        for mode, m in medians.items()
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in [headers, *rows]
    ]
    title = (
        f"{args.clients} clients in {args.processes} processes, single-job enqueue transactions, "
        f"{args.seconds:g} s each after {args.warmup:g} s, medians of {args.runs} runs "
        f"(NOTIFY_INTERVAL {args.interval:g} s)"
    )
    return "\n".join([title, *lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default="", help="Use this database instead of a cluster of its own.")
    parser.add_argument("--clients", type=int, default=64, help="Client threads in all (default 64).")
    parser.add_argument(
        "--processes", type=int, default=8, help="Processes they are spread over (default 8)."
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="Measured seconds per run (default 10).")
    parser.add_argument("--warmup", type=float, default=3.0, help="Seconds before the measure (default 3).")
    parser.add_argument("--runs", type=int, default=5, help="Runs of each mode; medians (default 5).")
    parser.add_argument("--modes", default=",".join(MODES), help=f"Comma-separated, of {', '.join(MODES)}.")
    parser.add_argument("--interval", type=float, default=0.05, help="NOTIFY_INTERVAL of coalesced (0.05).")
    parser.add_argument("--json", default="", help="Also write every run's figures to this file.")
    parser.add_argument(
        "--pgbench",
        action="store_true",
        help="The server's side alone: pgbench clients send the enqueue's INSERT (no Django, no Python).",
    )
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=8, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client(args)
        return
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    from benchmarks._common import conninfo as to_conninfo

    load_before = uptime()
    with contextlib.ExitStack() as stack:
        url = args.pg_url or stack.enter_context(own_cluster())
        migrate(url)
        info = to_conninfo(url)
        heard = Heard(info)
        stack.callback(heard.close)
        clients: Clients | PgbenchClients = (
            PgbenchClients(args, url, info) if args.pgbench else Clients(args, url)
        )
        stack.callback(clients.close)
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for round_ in range(args.runs):
            order = modes[round_ % len(modes) :] + modes[: round_ % len(modes)]
            for mode in order:
                figures = one_run(args, clients, info, mode, heard)
                runs[mode].append(figures)
                print(
                    f"round {round_ + 1} {mode}: {figures['commits_per_second']:.0f} commits/s, "
                    f"commit p99 {figures['commit_p99_ms']:.2f} ms",
                    file=sys.stderr,
                    flush=True,
                )
    medians = {
        mode: {key: statistics.median(run[key] for run in runs[mode]) for key in runs[mode][0]}
        for mode in modes
    }
    print(report(medians, runs, args))
    print(f"load before: {load_before}")
    print(f"load after:  {uptime()}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"runs": runs, "medians": medians, "args": vars(args)}, indent=2)
        )


if __name__ == "__main__":
    main()
