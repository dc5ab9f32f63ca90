"""A producer process for the concurrency test: enqueues one keyed charge when told to.

``python -m tests.processes.idempotent_producer MODE KEY`` prints ``ready`` once connected,
waits for a line on stdin, enqueues (in autocommit, or inside a transaction held open a
moment so the other producers meet an uncommitted key), and prints the job id as JSON.
"""

import json
import sys
import time


def main() -> None:
    import django

    django.setup()
    from django.db import connection, transaction

    from tests.testapp import tasks_idem

    mode, key = sys.argv[1], sys.argv[2]
    connection.ensure_connection()
    print("ready", flush=True)
    sys.stdin.readline()
    charge = tasks_idem.charge.using(idempotency_key=key)
    if mode == "atomic":
        with transaction.atomic():
            job = charge.enqueue(order_id=1, amount=100)
            time.sleep(0.2)
    else:
        job = charge.enqueue(order_id=1, amount=100)
    print(json.dumps({"job": job.pk}), flush=True)


if __name__ == "__main__":
    main()
