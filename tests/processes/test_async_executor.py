"""The async executor (``--async-slots``) in real worker processes: crashes, a blocked loop, shutdown."""

import io
import json
import re
import signal

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from django_jobguard.models import DeadLetter, Job, WorkerBeat
from django_jobguard.worker import EXIT_LOOP_WEDGED
from tests.conftest import statuses, wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution, LedgerEntry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def running(jobs):
    return statuses(jobs).count("running")


def test_a_sigkill_with_200_coroutines_in_flight_loses_nothing_and_runs_no_atomic_job_twice(workers):
    plain = [tasks.sleep_async.enqueue(f"p{i}", seconds=60, first_only=True) for i in range(200)]
    atomic = [tasks.record_async.enqueue(f"a{i}", seconds=60) for i in range(10)]
    first = workers.start("--async-slots", "250", "--worker-id", "first")
    wait_for(lambda: running(plain + atomic) == 210, message="all 210 jobs to be claimed and started")
    first.kill()  # SIGKILL: no hand-back, no ack
    first.wait(timeout=10)
    second = workers.start("--async-slots", "250", "--worker-id", "second")
    wait_for(
        lambda: statuses(plain + atomic).count("succeeded") == 210,
        timeout=120,
        message="the second worker to recover and finish every job",
    )
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in plain + atomic]).values_list("worker_id", flat=True)
    ) == {"second"}
    # Every atomic job's effect exists once, written by its second attempt: the first rolled back.
    assert sorted(LedgerEntry.objects.values_list("effect_key", flat=True)) == sorted(
        f"a{i}" for i in range(10)
    )
    assert set(Execution.objects.filter(marker__startswith="a").values_list("attempt", flat=True)) == {2}
    assert second.poll() is None


def test_a_coroutine_that_blocks_the_loop_is_logged_with_its_task_and_job(workers):
    job = tasks.blocks_loop_async.enqueue(1.5)
    proc = workers.start("--async-slots", "10")
    wait_for(lambda: statuses([job]) == ["succeeded"], message="the blocking job to finish")
    wait_for(lambda: "event_loop_blocked" in workers.log(proc), message="the blocked loop to be logged")
    line = next(line for line in workers.log(proc).splitlines() if "event_loop_blocked" in line)
    assert f"task={job.task_name} job_id={job.pk} " in line, line
    assert "tasks.py" in line, line  # where it is stuck: the handler's time.sleep line


def test_a_coroutine_blocking_the_loop_past_its_timeout_fails_and_the_jobs_behind_it_are_released(workers):
    # Its 2 s timeout cannot cancel code that never awaits: it holds the loop for 8 s.
    blocker = tasks.busy_loop_async.enqueue(seconds=8)
    behind = [tasks.sleep_async.enqueue(f"b{i}", seconds=0.1) for i in range(5)]  # 2 s leases
    proc = workers.start("--async-slots", "10")
    wait_for(
        lambda: statuses([blocker]) == ["dead"], message="the blocking job to be failed past its timeout"
    )
    letter = DeadLetter.objects.get(job=blocker)
    assert letter.reason == "hard_timeout"
    assert (
        "past its hard timeout of 2" in letter.error_message
        and "blocking its event loop" in letter.error_message
    ), letter.error_message
    # The jobs waiting on the blocked loop stop having their leases renewed past their bound.
    wait_for(
        lambda: workers.log(proc).count("lease_released") == 5,
        message="the 5 leases behind it to be released",
    )
    log = workers.log(proc)
    for job in behind:
        assert f"lease_released job_id={job.pk} task={job.task_name} " in log, log[-3000:]
    # The loop runs again: the blocker's late result is refused, the others run (again).
    wait_for(
        lambda: f"ack_rejected job_id={blocker.pk};" in workers.log(proc), message="its late ack refused"
    )
    wait_for(lambda: statuses(behind) == ["succeeded"] * 5, message="the jobs behind it to run")
    blocker.refresh_from_db()
    assert (blocker.status, blocker.result) == ("dead", None)
    assert "event_loop_wedged" not in workers.log(proc)  # 8 s is short of 2 s plus the margin
    assert proc.poll() is None


def test_a_loop_blocked_past_every_async_timeout_stops_the_worker_and_others_take_its_jobs(workers):
    blocker = tasks.busy_loop_async.enqueue(seconds=600)
    behind = [tasks.sleep_async.enqueue(f"w{i}", seconds=0.1) for i in range(5)]
    first = workers.start("--async-slots", "10", "--worker-id", "first")
    wait_for(
        lambda: (
            Job.objects.filter(pk__in=[j.pk for j in behind], worker_id="first").count() == 5
            and "event_loop_blocked" in workers.log(first)
        ),
        message="the first worker to claim them all and its loop to block",
    )
    workers.start("--async-slots", "10", "--worker-id", "second")
    assert first.wait(timeout=120) == EXIT_LOOP_WEDGED, workers.log(first)[-3000:]
    log = workers.log(first)
    line = next(line for line in log.splitlines() if "event_loop_wedged" in line)
    assert f"task={blocker.task_name} job_id={blocker.pk} " in line, line
    assert "longest async task timeout" in line, line
    # Its leases were let go before: the jobs behind it did not wait for the exit.
    released = [log.index(f"lease_released job_id={job.pk} ") for job in behind]
    assert max(released) < log.index("event_loop_wedged")
    wait_for(
        lambda: statuses(behind) == ["succeeded"] * 5, message="the second worker to run the jobs behind it"
    )
    assert set(Job.objects.filter(pk__in=[j.pk for j in behind]).values_list("worker_id", flat=True)) == {
        "second"
    }
    blocker.refresh_from_db()
    assert blocker.status == "dead"
    assert DeadLetter.objects.get(job=blocker).reason == "hard_timeout"


def test_a_timeout_cancels_its_own_coroutine_only_and_sync_tasks_run_on_threads(workers):
    late = tasks.times_out_async.enqueue()
    others = [tasks.sleep_async.enqueue(f"t{i}", seconds=1.5) for i in range(20)]
    sync = [tasks.thread_name.enqueue() for _ in range(3)]
    done = workers.burst("--async-slots", "30", "--concurrency", "2")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    late.refresh_from_db()
    assert late.status == "dead"
    assert DeadLetter.objects.get(job=late).reason == "hard_timeout"
    assert statuses(others) == ["succeeded"] * 20
    for job in sync:
        job.refresh_from_db()
        assert job.status == "succeeded"
        assert job.result.startswith("jobguard-exec-"), job.result  # a thread, never the loop


def test_sigterm_lets_coroutines_finish_within_the_grace_and_hands_the_rest_back(workers):
    quick = [tasks.marks_start_async.enqueue(f"q{i}", seconds=1) for i in range(50)]
    slow = [tasks.marks_start_async.enqueue(f"s{i}", seconds=120) for i in range(5)]
    proc = workers.start("--async-slots", "100", "--shutdown-grace", "4")
    # A row is `running` from its claim, but a coroutine the loop has not started yet is handed
    # back at once, as designed: wait for each coroutine's own first write, not for the status.
    wait_for(
        lambda: Execution.objects.filter(job_id__in=[j.pk for j in quick + slow]).count() == 55,
        timeout=120,
        message="all 55 coroutines to begin",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, workers.log(proc)[-2000:]
    assert statuses(quick) == ["succeeded"] * 50
    for job in slow:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.lease_token) == ("queued", 0, None)
    assert workers.log(proc).count("job_handed_back") == 5


def test_an_atomic_coroutine_past_the_grace_is_handed_back_and_its_writes_roll_back(workers):
    # Inside its open transaction on a DB thread (on SQLite it holds the write lock, so the
    # worker cuts that thread's connection before the hand-back).
    job = tasks.record_async.enqueue("atomic-slow", seconds=120)
    proc = workers.start("--async-slots", "10", "--shutdown-grace", "1")
    wait_for(lambda: statuses([job]) == ["running"], message="the atomic coroutine to start")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, workers.log(proc)[-2000:]
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_token) == ("queued", 0, None)
    assert "job_handed_back" in workers.log(proc)
    assert not LedgerEntry.objects.exists()  # the attempt's writes rolled back


@pytest.mark.postgres
def test_500_coroutines_in_flight_use_fewer_than_10_database_connections(workers):
    # Each waits long enough that the last claim of the 500 lands before the first finishes,
    # even on a loaded machine (5 s did not, beside a failover test).
    jobs = [tasks.sleep_async.enqueue(f"c{i}", seconds=30) for i in range(500)]
    proc = workers.start("--async-slots", "500")
    wait_for(lambda: running(jobs) == 500, timeout=120, message="500 coroutines in flight")

    def connections_of_the_worker():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]

    most = max(connections_of_the_worker() for _ in range(10))
    wait_for(lambda: statuses(jobs).count("succeeded") == 500, timeout=240, message="all 500 to finish")
    most = max(most, connections_of_the_worker())
    assert 0 < most < 10, most
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_async_slots_of_zero_or_less_is_a_usage_error(workers):
    for value in ("0", "-5"):
        done = workers.burst("--async-slots", value)
        assert done.returncode == 2
        assert b"--async-slots: must be 1 or more" in done.stderr, done.stderr


def test_operators_see_the_slots_in_use_and_the_loop_lag(workers, admin_client):
    from tests.support.prometheus import free_port, scrape_worker, value

    jobs = [tasks.sleep_async.enqueue(f"o{i}", seconds=15) for i in range(20)]
    port = free_port()
    proc = workers.start("--async-slots", "50", "--worker-id", "loop-1", "--metrics-port", str(port))
    wait_for(lambda: running(jobs) == 20, message="20 coroutines in flight")
    # The beat row (one upsert every 5 s).
    wait_for(
        lambda: WorkerBeat.objects.filter(pk="loop-1", async_slots=50, async_in_use=20).exists(),
        timeout=30,
        message="the beat row to show 20 of 50 slots in use",
    )
    # jobguard_status, as a table and as JSON.
    out = io.StringIO()
    call_command("jobguard_status", stdout=out)
    assert re.search(r"^loop-1\s+20/50\s+\d+ms$", out.getvalue(), re.MULTILINE), out.getvalue()
    out = io.StringIO()
    call_command("jobguard_status", "--json", stdout=out)
    (loop,) = json.loads(out.getvalue())["event_loops"]
    assert (loop["worker_id"], loop["slots"], loop["in_use"]) == ("loop-1", 50, 20)
    # The console's workers page.
    page = admin_client.get(reverse("admin:jobguard_workerbeat_changelist")).content.decode()
    row = page[page.find(">loop-1<") :][:1500]
    assert "20/50" in row and "Event loop lag" in page, row
    # The worker's own metrics.
    samples = scrape_worker(port)
    assert value(samples, "jobguard_worker_async_slots") == 50
    assert value(samples, "jobguard_worker_async_slots_in_use") == 20
    assert ("jobguard_worker_event_loop_lag_seconds", frozenset()) in samples
    proc.kill()


def test_an_async_only_worker_puts_sync_tasks_back_with_the_reason_and_a_thread_worker_runs_them(workers):
    sync = tasks.add.enqueue(2, b=3)
    coroutine = tasks.add_async.enqueue(4, b=5)
    only_async = workers.start("--async-slots", "10", "--concurrency", "0")
    wait_for(
        lambda: statuses([coroutine]) == ["succeeded"], message="the async-only worker to run the coroutine"
    )
    wait_for(lambda: "job_refused" in workers.log(only_async), message="the sync job to be refused")
    sync.refresh_from_db()
    assert (sync.status, sync.attempts) == ("queued", 0)  # back in the queue, no attempt used
    assert "is not an async def task" in sync.last_error, sync.last_error
    assert f"job_refused job_id={sync.pk} task={sync.task_name}" in workers.log(only_async)
    only_async.kill()
    workers.start("--concurrency", "1")  # due again after the refusal's delay
    wait_for(lambda: statuses([sync]) == ["succeeded"], message="a worker with threads to run it")
    sync.refresh_from_db()
    assert (sync.result, sync.attempts) == (5, 1)


def test_concurrency_0_without_async_slots_is_a_usage_error(workers):
    done = workers.burst("--concurrency", "0")
    assert done.returncode == 1
    assert b"--concurrency 0 leaves no thread to run jobs on" in done.stderr, done.stderr
