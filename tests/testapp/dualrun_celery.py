"""The old release of the Celery dual-run test: Celery's own ``shared_task`` on a Redis broker.

Imported only by the processes that have Celery on their path (the test's enqueuer and
``celery worker``), never by the test process: Celery is no dependency of the project.
``JOBGUARD_TEST_CELERY_BROKER_URL`` is the broker, ``JOBGUARD_TEST_CELERY_PREFIX`` prefixes
every key Celery writes there, so a run keeps to its own keys in a shared Redis database.
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from celery import Celery, shared_task  # noqa: E402

from . import dualrun  # noqa: E402

app = Celery("dualrun", broker=os.environ["JOBGUARD_TEST_CELERY_BROKER_URL"])
app.conf.update(
    # Acknowledged after the run: a message leaves the broker (its unacked set) only once done.
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"global_keyprefix": os.environ["JOBGUARD_TEST_CELERY_PREFIX"]},
)


@shared_task
def charge_order(order_id):
    return dualrun.charge_order(order_id, side="celery")
