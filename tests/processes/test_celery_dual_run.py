"""The switch from Celery with both running: no order lost, none charged twice (move-from-celery.md).

Real processes, no mocks: Celery's own worker (``celery worker --pool threads``) drains what
the old release put in a Redis broker while a ``jobguard_worker`` takes the new release's
work, some orders sent on both sides. Celery is no dependency of the project: it is installed
for this test only, into a directory of its own that only the Celery processes put on their
path (``pip install --target DIR "celery[redis]==5.7.0"``, then
``JOBGUARD_TEST_CELERY_PATH=DIR``; .ci/run does both). The broker is
``JOBGUARD_TEST_CELERY_BROKER_URL`` (default: ``JOBGUARD_TEST_REDIS_URL``), every key this
test writes there under a prefix of its own.
"""

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from django_jobguard.models import TERMINAL_STATUSES, Job
from tests.conftest import ROOT, wait_for, worker_env
from tests.testapp.dualrun import order_key
from tests.testapp.models import Execution, LedgerEntry

CELERY_PATH = os.environ.get("JOBGUARD_TEST_CELERY_PATH", "")
INSTALL = 'pip install --target DIR "celery[redis]==5.7.0" and set JOBGUARD_TEST_CELERY_PATH=DIR'


def _celery_missing() -> str:
    if not CELERY_PATH:
        return f"needs Celery in a directory of its own: {INSTALL}"
    # Looked for, not imported: the test process never imports from that directory.
    if not (Path(CELERY_PATH) / "celery" / "__main__.py").is_file():
        return f"JOBGUARD_TEST_CELERY_PATH={CELERY_PATH} holds no Celery: {INSTALL}"
    return ""


pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.processes,
    pytest.mark.slow,
    pytest.mark.skipif(bool(_celery_missing()), reason=_celery_missing() or "-"),
]

#: Orders 1..OLD went to the broker from the old release; OLD+1..OLD+NEW go to jobguard; the
#: last BOTH of the old ones are sent again through jobguard (twice each), as a web process
#: on the new release resends what one on the old release had sent.
OLD, NEW, BOTH = 200, 200, 20
OLD_IDS = list(range(1, OLD + 1))
NEW_IDS = list(range(OLD + 1, OLD + NEW + 1))
BOTH_IDS = OLD_IDS[-BOTH:]

ENQUEUE_ON_THE_OLD_RELEASE = """
import sys
from tests.testapp.dualrun_celery import charge_order
for order_id in range(1, int(sys.argv[1]) + 1):
    charge_order.delay(order_id)
"""


@pytest.fixture
def broker() -> Iterator[tuple[redis.Redis, str, str]]:
    url = os.environ.get("JOBGUARD_TEST_CELERY_BROKER_URL") or os.environ["JOBGUARD_TEST_REDIS_URL"]
    prefix = f"jobguard-dual-run-{uuid.uuid4().hex[:12]}:"
    client = redis.Redis.from_url(url)
    yield client, url, prefix
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)
    client.close()


def runs(kind: str) -> list[tuple[int, str]]:
    """(order id, side) of each ``dual-run:<kind>:<id>`` row: a handler run, or a charge."""
    rows = Execution.objects.filter(marker__startswith=f"dual-run:{kind}:").values_list("marker", "worker")
    return sorted((int(marker.rpartition(":")[2]), side) for marker, side in rows)


def test_celery_drains_the_old_work_jobguard_takes_the_new_none_lost_or_doubled(workers, broker, tmp_path):
    # Imported here: collecting the suite declares no Celery-style task in the test process.
    from tests.testapp.dualrun_jobguard import charge_order

    client, url, prefix = broker
    queue, unacked = f"{prefix}celery", f"{prefix}unacked"

    def broker_holds() -> int:
        return int(client.llen(queue)) + int(client.hlen(unacked))

    LedgerEntry.objects.bulk_create(LedgerEntry(effect_key=order_key(i)) for i in OLD_IDS + NEW_IDS)
    env = worker_env(
        JOBGUARD_TEST_CELERY_BROKER_URL=url, JOBGUARD_TEST_CELERY_PREFIX=prefix, JOBGUARD_TEST_DUAL_RUN="1"
    )
    celery_env = {**env, "PYTHONPATH": os.pathsep.join([CELERY_PATH, env["PYTHONPATH"]])}

    # 1. The old release, no Celery worker running: its orders wait in the broker.
    enqueued = subprocess.run(
        [sys.executable, "-c", ENQUEUE_ON_THE_OLD_RELEASE, str(OLD)],
        cwd=ROOT,
        env=celery_env,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert enqueued.returncode == 0, enqueued.stderr.decode(errors="replace")
    assert (client.llen(queue), client.hlen(unacked)) == (OLD, 0)

    # 2. The switch: the new release sends its orders through jobguard, and resends some of the
    # old ones; the key over the order collapses each resend to one job.
    for order_id in NEW_IDS + BOTH_IDS + BOTH_IDS:
        charge_order.delay(order_id)
    assert Job.objects.count() == NEW + BOTH

    # Both sides' workers at once: Celery's on the old release, jobguard's on the new.
    celery_log = tmp_path / "celery-worker.log"
    with celery_log.open("wb") as log:
        celery = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.testapp.dualrun_celery", "worker",
             "--pool", "threads", "-c", "2", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "--loglevel", "INFO"],
            cwd=ROOT, env=celery_env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        jobguard = workers.start("--worker-id", "dual-run", env={"JOBGUARD_TEST_DUAL_RUN": "1"})

        # 3. Drained and settled. A warm shutdown then lets Celery finish (and ack) a message it
        # took in between two reads of the broker; one it had not started goes back there.
        wait_for(
            lambda: broker_holds() == 0 and not Job.objects.exclude(status__in=TERMINAL_STATUSES).exists(),
            timeout=600, interval=0.5,
            message="Celery to drain the broker and jobguard to settle its jobs",
        )  # fmt: skip
        celery.send_signal(signal.SIGTERM)
        assert celery.wait(timeout=120) == 0, celery_log.read_text(errors="replace")[-4000:]
    finally:
        if celery.poll() is None:
            celery.kill()
            celery.wait(timeout=30)
    assert broker_holds() == 0, celery_log.read_text(errors="replace")[-4000:]
    jobguard.terminate()
    assert jobguard.wait(timeout=60) == 0, workers.log(jobguard)[-4000:]

    # Every order charged exactly once: none lost, none doubled, the ones sent on both sides too.
    charged = runs("charged")
    assert sorted(order_id for order_id, _ in charged) == OLD_IDS + NEW_IDS
    assert set(LedgerEntry.objects.values_list("amount", flat=True)) == {1}
    by_side = dict(charged)
    assert {by_side[i] for i in OLD_IDS if i not in BOTH_IDS} == {"celery"}
    assert {by_side[i] for i in NEW_IDS} == {"jobguard"}

    # Celery ran each message of the old release once, and nothing else; jobguard ran each new
    # order once and each resent one once (one job per key), and nothing of the old release.
    ran = runs("ran")
    assert [i for i, side in ran if side == "celery"] == OLD_IDS
    assert [i for i, side in ran if side == "jobguard"] == sorted(NEW_IDS + BOTH_IDS)
    assert Counter(Job.objects.values_list("status", flat=True)) == {"succeeded": NEW + BOTH}
    # The orders sent on both sides ran on both and were charged by whichever came first.
    assert Counter(i for i, _ in ran if i in BOTH_IDS) == dict.fromkeys(BOTH_IDS, 2)
