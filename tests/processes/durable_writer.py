"""A writer process: one transaction that writes a row and invalidates a key durably.

``python -m tests.processes.durable_writer ALIAS KEY OWNER`` creates an ``Account`` named
OWNER and calls ``invalidate(KEY, cache_alias=ALIAS, durable=True)`` in one transaction. Run
with ``JOBGUARD_TEST_FAULTS=cache_after_commit=1``, it is SIGKILLed after the commit and
before its on_commit delete: only the durable job is left to delete the key.
"""

import sys


def main() -> None:
    import django

    django.setup()
    from django.db import transaction

    from django_jobguard.cache import invalidate
    from tests.testapp.models import Account

    alias, key, owner = sys.argv[1], sys.argv[2], sys.argv[3]
    with transaction.atomic():
        Account.objects.create(owner=owner)
        invalidate(key, cache_alias=alias, durable=True)
    print("on_commit ran", flush=True)


if __name__ == "__main__":
    main()
