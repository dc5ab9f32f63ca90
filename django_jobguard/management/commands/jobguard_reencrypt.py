"""``manage.py jobguard_reencrypt``: seal every stored ciphertext again under the current key.

See :func:`django_jobguard.encryption.rotation.reencrypt`.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...encryption import keyring
from ...encryption.rotation import reencrypt
from ._options import add_database_argument, database_alias, non_negative_float, positive_int


class Command(BaseCommand):
    help = (
        "Re-encrypt, under the current key (the first of JOBGUARD['ENCRYPTION']['KEYS']), every stored "
        "value encrypted under another key: jobs, dead letters, replay events, idempotency keys and "
        "schedules. In batches, a short transaction each, while workers run: a value a worker rewrites "
        "meanwhile is left to the worker. Interrupted, run it again: it continues where it stopped. "
        "Exits non-zero if a value cannot be decrypted (its key is missing or it was altered), after "
        "doing the rest."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=200,
            help="Rows read and written per transaction (default 200).",
        )
        parser.add_argument(
            "--sleep",
            type=non_negative_float,
            default=0.0,
            metavar="SECONDS",
            help="Pause between batches, to spare a busy database (default 0).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Count what would be re-encrypted and check that it decrypts; write nothing.",
        )
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        ring = keyring()
        if not ring.enabled:
            raise CommandError(
                "No encryption key is configured: set JOBGUARD['ENCRYPTION']['KEYS'] or the environment "
                "variable it names (KEYS_ENV), newest key first."
            )
        verbosity = int(options["verbosity"])

        def progress(table: str, rows: int) -> None:
            if verbosity >= 2:
                self.stdout.write(f"  {table}: {rows} value(s) written")

        report = reencrypt(
            database_alias(options),
            batch_size=options["batch_size"],
            sleep=options["sleep"],
            dry_run=options["dry_run"],
            on_batch=progress,
        )
        verb = "Would re-encrypt" if report.dry_run else "Re-encrypted"
        self.stdout.write(f"Current key: {report.current_key_id!r}.")
        for name, field in report.fields.items():
            if field.reencrypted or field.raced or verbosity >= 2:
                line = f"{name}: {verb.lower()} {field.reencrypted}"
                if field.raced:
                    line += f", {field.raced} still pending (rewritten by workers meanwhile: run again)"
                self.stdout.write(line)
        total = sum(field.reencrypted for field in report.fields.values())
        self.stdout.write(f"{verb} {total} value(s) in total.")
        for failure in report.failures:
            self.stderr.write(f"Cannot decrypt {failure}.")
        if report.failures:
            raise CommandError(
                f"{len(report.failures)} value(s) could not be decrypted (listed above) and were left as "
                "they are: configure the key they name, or, if they were altered, restore them from a "
                "backup. The others were re-encrypted."
            )
