"""The benchmark's publisher for jaiminho: reads a JSON list of messages per line on stdin,
saves them to jaiminho's outbox in one transaction, and answers with the time the commit returned.

    benchmarks/.venv-jaiminho/bin/python -m benchmarks.peers.jaiminho_app.publish

Runs in the peer's virtualenv (jaiminho's Django app); ``bench_outbox.py`` drives it.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import django

    django.setup()
    from django.db import transaction

    from benchmarks.peers.jaiminho_app.events import send

    for line in sys.stdin:
        rows = json.loads(line)
        with transaction.atomic():
            for message_id, key, seq, payload in rows:
                send(message_id, key, seq, payload)
        sys.stdout.write(json.dumps({"committed": time.time()}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
