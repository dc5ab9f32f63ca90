"""An enqueuer for the failover test: keeps enqueueing through a database failover.

``python -m tests.processes.failover_enqueuer OUT FIRST COUNT [BULK]`` enqueues jobs
``FIRST`` .. ``FIRST+COUNT-1``, even numbers to the atomic task and odd ones to the
non-atomic one, marker ``fo-<n>``. Without ``BULK`` each job is its own enqueue under the
idempotency key ``fo-<n>``: an enqueue that fails (the database went away) is tried again
with the same key until it returns, so one whose commit happened but whose answer was lost
is not stored twice. With ``BULK`` they go in ``bulk_enqueue`` calls of that many jobs.

Each acknowledged enqueue (the call returned, so its commit did) appends its marker to
``OUT`` at once: the file is what the test checks against the surviving database. The last
line is ``done retries=<n>``.
"""

import sys
import time


def main() -> None:
    import django

    django.setup()
    from django.db import DatabaseError, InterfaceError, connection

    from tests.testapp import tasks

    out_path, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    bulk = int(sys.argv[4]) if len(sys.argv) > 4 else 0

    def task_for(n: int):  # type: ignore[no-untyped-def]
        return tasks.record_atomic if n % 2 == 0 else tasks.record_plain

    retries = 0
    with open(out_path, "a") as out:
        if bulk:
            for start in range(first, first + count, bulk):
                numbers = range(start, min(start + bulk, first + count))
                for task in (tasks.record_atomic, tasks.record_plain):
                    mine = [n for n in numbers if task_for(n) is task]
                    if mine:
                        task.bulk_enqueue([((f"fo-{n}",), {}) for n in mine])
                out.write("".join(f"fo-{n}\n" for n in numbers))
            out.flush()
        else:
            for n in range(first, first + count):
                marker = f"fo-{n}"
                while True:
                    try:
                        task_for(n).using(idempotency_key=marker).enqueue(marker)
                        break
                    except (DatabaseError, InterfaceError):
                        retries += 1
                        connection.close()
                        time.sleep(0.05)
                out.write(f"{marker}\n")
                out.flush()
        out.write(f"done retries={retries}\n")


if __name__ == "__main__":
    main()
