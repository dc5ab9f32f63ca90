"""A web-process stand-in for the PgBouncer tests: enqueue and the admin, through the pooled alias.

``python -m tests.processes.pooled_client COUNT`` (with ``JOBGUARD_TEST_PGBOUNCER_PORT`` set,
so "default" goes through PgBouncer) enqueues COUNT ``record`` jobs inside one transaction
plus one keyed job twice, renders the admin's job list as the superuser ``admin``, and
prints what it saw as JSON.
"""

import json
import sys


def main() -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.urls import reverse

    from tests.testapp import tasks

    count = int(sys.argv[1])
    with transaction.atomic():
        jobs = [tasks.record.enqueue(f"pooled:{index}") for index in range(count)]
    keyed = tasks.record.using(idempotency_key="pooled:keyed")
    first, again = keyed.enqueue("pooled:keyed"), keyed.enqueue("pooled:keyed")
    setup_test_environment()  # the test client's host name is allowed
    client = Client()
    client.force_login(get_user_model().objects.get(username="admin"))
    page = client.get(reverse("admin:jobguard_job_changelist"))
    print(
        json.dumps(
            {
                "port": connection.settings_dict["PORT"],
                "jobs": [job.pk for job in jobs],
                "keyed": [first.pk, again.pk],
                "admin_status": page.status_code,
                "admin_lists_keyed_job": reverse("admin:jobguard_job_change", args=[first.pk]) in page.text,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
