"""A writer process for the compare-and-set test: many versioned writes to one key.

``python -m tests.processes.versioned_writer ALIAS KEY SEED COUNT`` prints ``ready`` once
connected, waits for a line on stdin (so every writer starts together), writes versions
1..COUNT in an order shuffled by SEED, and prints, as JSON, each version with whether the
write was accepted, in the order written.
"""

import json
import random
import sys

#: Versions are shuffled within windows of this many, so writers keep meeting in the same range.
WINDOW = 25


def main() -> None:
    import django

    django.setup()
    from django_jobguard.cache import get_versioned, set_versioned

    alias, key, seed, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    get_versioned(key, cache_alias=alias)  # connect before the start signal
    order = []
    rng = random.Random(seed)
    for start in range(1, count + 1, WINDOW):
        window = list(range(start, min(start + WINDOW, count + 1)))
        rng.shuffle(window)
        order += window
    print("ready", flush=True)
    sys.stdin.readline()
    results = [
        [version, set_versioned(key, f"{seed}:{version}", version, cache_alias=alias)] for version in order
    ]
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
