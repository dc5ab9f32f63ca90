"""The demo's runner: real worker processes, the acts, the live display, the proofs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import connection
from rich import box
from rich.console import Console
from rich.table import Table

from django_jobguard.monitoring.audit import audit

from .acts import Act, Proof, build_acts, create_demo_users, reset
from .display import Display, snapshot

#: Seconds between two reads of the database for the display.
REFRESH_SECONDS = 0.5
#: Seconds between two ticks of the acts.
TICK_SECONDS = 0.1
#: Seconds the whole run may take before the demo gives up and says what is stuck.
DEADLINE_SECONDS = 240.0
#: Seconds the workers get to stop after SIGTERM.
STOP_SECONDS = 60.0


class Demo:
    """One run of the demo. ``run()`` returns the summary (also written as JSON if asked)."""

    def __init__(self, console: Console, orders: int, summary_path: Path | None) -> None:
        self.console = console
        self.orders = orders
        self.summary_path = summary_path
        self.base_dir = Path(settings.BASE_DIR)
        self.log_dir = self.base_dir / ".cache" / "logs"
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []
        self.extra_duplicates = 0
        self.display: Display | None = None

    # -- used by the acts -------------------------------------------------------------

    def start_worker(self, worker_id: str, queues: list[str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``manage.py jobguard_worker`` as a subprocess, its logs in .cache/logs/."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{worker_id}.log").open("wb")
        self._logs.append(log)
        command = [sys.executable, str(self.base_dir / "manage.py"), "jobguard_worker"]
        command += ["--worker-id", worker_id, "--concurrency", "2"]
        for queue in queues or []:
            command += ["--queue", queue]
        env = {**os.environ, "JOBGUARD_LOG_LEVEL": os.environ.get("JOBGUARD_LOG_LEVEL", "INFO")}
        proc = subprocess.Popen(command, cwd=self.base_dir, env=env, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603 - fixed arguments
        self.workers[worker_id] = proc
        self.note(f"started {worker_id} (pid {proc.pid}) on {', '.join(queues) if queues else 'every queue'}")
        return proc

    def note(self, text: str) -> None:
        if self.display is not None:
            self.display.note(text)

    # -- the run -----------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        reset()
        users = create_demo_users()
        self.requester = users["requester"][0]
        acts = build_acts(self.orders)
        vendor = connection.vendor
        locks = settings.JOBGUARD.get("LOCKS", {}).get("BACKEND", "database")
        self.console.print(
            f"django-jobguard demo: {self.orders} orders on {vendor} ({locks} locks), "
            f"worker logs in {self.log_dir.relative_to(self.base_dir)}/",
            highlight=False,
        )
        try:
            with Display(self.console, list(settings.JOBGUARD["QUEUES"])) as display:
                self.display = display
                for act in acts:
                    act.start(self)
                self.start_worker(
                    "worker-a",
                    queues=[q for q in settings.JOBGUARD["QUEUES"] if q != "fulfilment"],
                )
                self._drive(acts, display, started)
                self._stop_workers()
                display.update(snapshot())
        finally:
            self._kill_leftovers()
        for act in acts:
            act.after_workers(self)
        return self._summarize(acts, users, time.monotonic() - started)

    def _drive(self, acts: list[Act], display: Display, started: float) -> None:
        last_read = 0.0
        while True:
            for act in acts:
                act.tick(self)
            now = time.monotonic()
            if now - last_read >= REFRESH_SECONDS:
                last_read = now
                shot = snapshot()
                display.update(shot)
                if all(act.done for act in acts) and shot.unfinished == 0:
                    return
                for worker_id, proc in self.workers.items():
                    if worker_id != "worker-killed" and proc.poll() is not None:
                        raise RuntimeError(
                            f"{worker_id} exited with code {proc.returncode}; see "
                            f"{self.log_dir / (worker_id + '.log')}"
                        )
            if now - started > DEADLINE_SECONDS:
                waiting = [type(act).__name__ for act in acts if not act.done]
                raise RuntimeError(
                    f"the demo did not finish in {DEADLINE_SECONDS:.0f}s: acts still enqueueing: "
                    f"{waiting or 'none'}, jobs unfinished: {snapshot().unfinished}"
                )
            time.sleep(TICK_SECONDS)

    def _stop_workers(self) -> None:
        alive = {wid: p for wid, p in self.workers.items() if p.poll() is None}
        for proc in alive.values():
            proc.send_signal(signal.SIGTERM)  # stop claiming, finish, release locks, exit 0
        for worker_id, proc in alive.items():
            code = proc.wait(timeout=STOP_SECONDS)
            self.note(f"stopped {worker_id} (exit code {code})")

    def _kill_leftovers(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in self._logs:
            log.close()

    # -- the summary ---------------------------------------------------------------------

    def _summarize(
        self, acts: list[Act], users: dict[str, tuple[Any, str]], elapsed: float
    ) -> dict[str, Any]:
        proofs: list[tuple[Act, Proof]] = [(act, proof) for act in acts for proof in act.proofs(self)]
        findings = [f"{f.check} ({f.count})" for f in audit() if not f.ok]
        proofs.append(
            (
                Act(),
                Proof(
                    "consistency audit clean",
                    "jobguard_audit: " + (", ".join(findings) if findings else "nothing found"),
                    not findings,
                    {"findings": findings},
                ),
            )
        )
        shot = snapshot()
        table = Table(
            title=f"What the database says ({elapsed:.1f}s)",
            box=box.SIMPLE_HEAD if self.console.is_terminal else box.ASCII,
            show_lines=False,
            expand=False,
        )
        table.add_column("guarantee", style="bold", ratio=2)
        table.add_column("evidence", ratio=5)
        table.add_column("ok", justify="center")
        for _, proof in proofs:
            table.add_row(proof.guarantee, proof.evidence, "[green]yes" if proof.ok else "[red bold]NO")
        self.console.print(table)
        summary: dict[str, Any] = {
            "ok": all(p.ok for _, p in proofs),
            "elapsed_seconds": round(elapsed, 1),
            "database": connection.vendor,
            "lock_backend": settings.JOBGUARD.get("LOCKS", {}).get("BACKEND", "database"),
            "totals": {
                "jobs": sum(sum(q.values()) for q in shot.queues.values()),
                "succeeded": shot.succeeded,
                "dead": shot.dead,
                "retried": shot.retried,
                "lock_contentions": shot.contentions,
                "duplicates_stopped": shot.duplicates,
                "reappeared": shot.reappeared,
            },
            "proofs": [
                {"act": act.name, "guarantee": p.guarantee, "ok": p.ok, "figures": p.figures}
                for act, p in proofs
            ],
            "users": sorted(users),
        }
        if self.summary_path is not None:
            self.summary_path.write_text(json.dumps(summary, indent=2, default=str))
        (requester, requester_pw), (approver, approver_pw) = users["requester"], users["approver"]
        self.console.print(
            "\n[bold]Next:[/bold] a corrected replay of the malformed webhook waits for approval.\n"
            "  make console   (runserver and a worker; from example_project/: "
            "python manage.py runserver)\n"
            "  open http://127.0.0.1:8000/admin/jobguard/deadletter/\n"
            f"  log in as {approver.username} / {approver_pw} and approve it; {requester.username} / "
            f"{requester_pw}\n  requested it, and may request replays but not approve them",
            highlight=False,
        )
        return summary
