"""Where django-jobguard's worker (and enqueue) spends its CPU: py-spy and cProfile.

py-spy samples the running workers without instrumenting them, so its shares are
the true ones; cProfile instruments every call (which inflates call-heavy code) but
counts calls exactly. Both run the throughput workload's headline configuration.
"""

from __future__ import annotations

import collections
import pstats
import shutil
import sys
from pathlib import Path

from benchmarks._report import table
from benchmarks._systems import ROOT, WORKER_PROCESSES, Jobguard, Servers, Workers, enqueue
from benchmarks._workloads import throughput_run

#: py-spy samples per second per worker process.
PYSPY_RATE_HZ = 1000
#: A sample counts as work when one of these is on its stack (not imports or setup).
_WORK_FRAMES = ("Worker.", "Thread.run")


def profile(servers: Servers, workdir: Path, n: int, peers_python: str | None) -> str:
    """Profile the worker on ``n`` no-op jobs (py-spy, then cProfile) and the enqueue paths."""
    system = Jobguard(servers, sys.executable)
    system.setup()
    sections = [
        f"## Profile: django-jobguard, {n:,} no-op jobs, `@task(atomic=True)`, metrics on, "
        f"{WORKER_PROCESSES} worker processes x 2 threads"
    ]
    plain = throughput_run(system, workdir, n)
    sections.append(
        f"Unprofiled run: {plain['processing_rate']:,.0f} jobs/s, "
        f"worker CPU {plain['worker_cpu_ms_per_job']:.3f} ms/job."
    )
    pyspy = str(Path(peers_python).parent / "py-spy") if peers_python else shutil.which("py-spy")
    if pyspy and Path(pyspy).exists():
        sections.append(_pyspy(system, workdir, n, pyspy))
    else:
        sections.append("py-spy is not installed (it comes with benchmarks/.venv-peers); skipped.")

    result = throughput_run(system, workdir, n, profile=True)
    stats = pstats.Stats(*result["profiles"])  # type: ignore[arg-type]
    sections.append(
        "### cProfile, every thread of both workers\n\n"
        f"Instrumented: {result['processing_rate']:,.0f} jobs/s, worker CPU "
        f"{result['worker_cpu_ms_per_job']:.3f} ms/job (inflated by the profiler; read the call "
        "counts and the order, not the absolute times)."
    )
    sections.append(_top_functions(stats, n, "tottime", 30))
    sections.append(_top_functions(stats, n, "cumulative", 45, only_project=True))

    for mode in ("single", "bulk"):
        system.reset()
        path = workdir / f"enqueue-{mode}.pstats"
        enq = enqueue(system, workdir, n, mode=mode, profile=str(path))
        how = "one call per job" if mode == "single" else "calls of 1,000"
        sections.append(
            f"### cProfile of the enqueue client, {mode} ({how})"
            f"\n\nInstrumented: {enq['rate']:,.0f} jobs/s, client CPU "
            f"{enq['client_cpu_seconds'] * 1000 / n:.3f} ms/job."
        )
        sections.append(_top_functions(pstats.Stats(str(path)), n, "tottime", 20))
    return "\n\n".join(sections)


def _short(path: str) -> str:
    for marker in ("site-packages/", str(ROOT) + "/", "lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _top_functions(stats: pstats.Stats, n: int, key: str, limit: int, *, only_project: bool = False) -> str:
    entries = []
    for (filename, line, name), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if only_project and "django_jobguard" not in filename:
            continue
        entries.append((tt if key == "tottime" else ct, tt, ct, nc, f"{_short(filename)}:{line}({name})"))
    entries.sort(reverse=True)
    rows = [
        [f"{tt * 1e6 / n:.1f}", f"{ct * 1e6 / n:.1f}", f"{nc / n:.2f}", where]
        for _sort, tt, ct, nc, where in entries[:limit]
    ]
    title = (
        "django_jobguard functions by cumulative time"
        if only_project
        else f"top {limit} functions by own time"
    )
    return f"{title} (microseconds per job):\n\n" + table(
        ["own us/job", "cumulative us/job", "calls/job", "function"], rows
    )


def _pyspy(system: Jobguard, workdir: Path, n: int, pyspy: str) -> str:
    """Sample both workers with py-spy; report own and inclusive shares of the busy samples."""
    raws = [workdir / f"pyspy-{index}.txt" for index in range(WORKER_PROCESSES)]

    def wrap(index: int) -> list[str]:
        rate = str(PYSPY_RATE_HZ)
        return [
            pyspy,
            "record",
            "--format",
            "raw",
            "--rate",
            rate,
            "--gil",
            "--threads",
            "-o",
            str(raws[index]),
            "--",
        ]

    workers = Workers(system, workdir, burst=True, wrap=wrap)
    result = throughput_run(system, workdir, n, workers=workers)
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    by_thread: collections.Counter[str] = collections.Counter()
    total = 0
    for raw in raws:
        if not raw.exists():
            return f"py-spy wrote no samples (see {raw.name}); skipped."
        for line in raw.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [_frame(f) for f in stack.split(";") if f]
            thread = next((f for f in frames if f.startswith("thread ")), "")
            frames = [f for f in frames if not f.startswith(("thread ", "process "))]
            # Only the work after the go signal: imports and Django's setup are start-up.
            if not any(marker in f for f in frames for marker in _WORK_FRAMES):
                continue
            total += count
            own[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
            by_thread[_thread_role(frames, thread)] += count
    if not total:
        return "py-spy recorded no busy samples; skipped."
    cpu_ms = result["worker_cpu_ms_per_job"]

    def rows(counter: collections.Counter[str], limit: int, keep: str = "") -> list[list[str]]:
        picked = [(f, c) for f, c in counter.most_common() if keep in f][:limit]
        return [[f"{100 * c / total:.1f}%", f"{cpu_ms * c / total * 1000:.0f}", f] for f, c in picked]

    headers = ["share", "~us/job", "frame"]
    return (
        f"### py-spy, both workers, {PYSPY_RATE_HZ} Hz, samples holding the GIL after start-up "
        f"({total:,})\n\n"
        f"Sampled run: {result['processing_rate']:,.0f} jobs/s, worker CPU {cpu_ms:.3f} ms/job; "
        "~us/job spreads that CPU time by share of samples.\n\n"
        "By thread:\n\n"
        + table(
            ["share", "~us/job", "thread"],
            [
                [f"{100 * c / total:.1f}%", f"{cpu_ms * c / total * 1000:.0f}", t]
                for t, c in by_thread.most_common()
            ],
        )
        + "\n\nInclusive (samples with the frame anywhere on the stack), django_jobguard frames:\n\n"
        + table(headers, rows(inclusive, 30, keep="django_jobguard"))
        + "\n\nInclusive, every frame:\n\n"
        + table(headers, rows(inclusive, 40))
        + "\n\nOwn samples (the frame on top of the stack):\n\n"
        + table(headers, rows(own, 30))
    )


def _frame(frame: str) -> str:
    # py-spy raw frames read "function (path/to/file.py:123)".
    name, sep, rest = frame.partition(" (")
    if not sep:
        return frame
    path, _, line = rest.rstrip(")").rpartition(":")
    return f"{name} ({_short(path)}:{line})"


def _thread_role(frames: list[str], thread: str) -> str:
    for frame in frames:
        for marker, role in (
            ("Executor.run", "executor threads"),
            ("Heartbeat.run", "heartbeat thread"),
            ("Worker._loop", "main thread: claim loop"),
            ("Worker.run", "main thread: start/stop"),
        ):
            if marker in frame:
                return role
    return f"other ({thread or 'main'})"
