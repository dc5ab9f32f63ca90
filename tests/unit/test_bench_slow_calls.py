"""bench_slow_calls.py's own logic: the call every system makes, percentiles, /proc, the table."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks import bench_slow_calls as bench
from benchmarks._slow_http import get_async, get_blocking


class _Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        status = 200 if self.path != "/500" else 500
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server_port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_the_blocking_and_the_async_call_make_the_same_exchange(server_port: int) -> None:
    assert get_blocking("127.0.0.1", server_port, 1) == asyncio.run(get_async("127.0.0.1", server_port, 1))


@pytest.mark.parametrize("call", ["blocking", "async"])
def test_an_answer_other_than_200_fails_the_call(server_port: int, call: str) -> None:
    with pytest.raises(RuntimeError, match="unexpected answer"):
        if call == "blocking":
            get_blocking("127.0.0.1", server_port, 500)
        else:
            asyncio.run(get_async("127.0.0.1", server_port, 500))


def test_percentile_interpolates_like_percentile_cont() -> None:
    assert bench.percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert bench.percentile([1.0, 2.0], 0.99) == pytest.approx(1.99)
    assert bench.percentile([7.0], 0.99) == 7.0


def test_the_process_tree_counts_the_children_cpu_and_memory() -> None:
    # A parent that starts a child which burns CPU: the tree has both, and their CPU adds up.
    # The child burns 0.3 s of CPU, then waits to be killed (no timer of its own).
    child = (
        "import signal, time\nt = time.process_time()\n"
        "while time.process_time() - t < 0.3: pass\nsignal.pause()"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"]
    )
    try:
        deadline = time.monotonic() + 60.0
        tree: list[int] = []
        while time.monotonic() < deadline:
            tree = bench.process_tree(parent.pid)
            if len(tree) == 2 and bench.cpu_seconds(tree[1:]) >= 0.3:
                break
            threading.Event().wait(0.05)
        assert tree[0] == parent.pid and len(tree) == 2
        assert bench.cpu_seconds(tree) >= bench.cpu_seconds(tree[1:]) >= 0.3
        assert bench.rss_mib(tree) > bench.rss_mib(tree[:1]) > 0
    finally:
        for pid in reversed(bench.process_tree(parent.pid)):
            subprocess.run(["kill", str(pid)], check=False)
        parent.wait(timeout=30)


def test_the_table_shows_every_column_of_each_mode() -> None:
    values = {key: 1.0 for _, key, _ in bench.COLUMNS} | {"jobs_per_s": 4321.4, "of_bound": 0.864}
    lines = bench.table({"jobguard async 500": values}).splitlines()
    assert lines[0].split(" | ")[0].strip() == "mode"
    assert [cell.strip() for cell in lines[2].split(" | ")][:3] == ["jobguard async 500", "4321", "86%"]
    assert len(lines[2].split(" | ")) == len(bench.COLUMNS) + 1


def test_each_mode_names_a_system_the_harness_drives() -> None:
    assert {mode.system for mode in bench.MODES.values()} == {
        "jobguard",
        "celery",
        "procrastinate",
        "arq",
        "bare",
    }
    assert all("," not in name for name in bench.MODES)  # --modes is comma-separated
