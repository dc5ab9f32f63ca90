"""``manage.py jobguard_encryption_key``: print a new encryption key and how to install it.

The key goes to standard output alone (``KEY=$(manage.py jobguard_encryption_key)`` captures
it); the advice goes to standard error, so it never lands in a captured key.
"""

from __future__ import annotations

import base64
import datetime
import os
import secrets
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...conf.encryption import KEY_BYTES, parse_key


def new_key(key_id: str | None = None) -> str:
    """A fresh "key_id:base64" key: 32 bytes from the operating system's CSPRNG."""
    if key_id is None:
        # A date says at a glance which key is newer; the suffix keeps two keys of one day apart.
        key_id = f"k{datetime.datetime.now(tz=datetime.UTC):%Y%m%d}-{secrets.token_hex(2)}"
    text = f"{key_id}:{base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode('ascii').rstrip('=')}"
    parse_key(text, "--id")  # the id's rules are the settings' rules: fail here, not at deploy
    return text


class Command(BaseCommand):
    help = (
        "Print a new key for JOBGUARD['ENCRYPTION'] (32 random bytes, as 'key_id:base64') on "
        "standard output, and how to install it on standard error."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--id",
            default=None,
            metavar="ID",
            help=(
                "The key id stored with every value the key encrypts: 1-32 letters, digits, '_', "
                "'.' or '-'. Default: k<date>-<4 hex digits>, e.g. k20250301-9f2c."
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            key = new_key(options["id"])
        except ValueError:
            raise CommandError(
                f"--id {options['id']!r} is not a key id: give 1-32 letters, digits, '_', '.' or '-'."
            ) from None
        key_id = key.partition(":")[0]
        self.stdout.write(key)
        self.stderr.write(
            f"\nKey {key_id!r}. Keep it in a secret store, never in the repository: losing it loses "
            "every value it encrypted.\n"
            "Install it in the environment, newest first, comma-separated:\n"
            f"  JOBGUARD_ENCRYPTION_KEYS='{key_id}:...,<older keys>'\n"
            "(or JOBGUARD['ENCRYPTION']['KEYS'], the variable JOBGUARD['ENCRYPTION']['KEYS_ENV'] names).\n"
            "Rotating: deploy it second first (every process can then decrypt it), then first, then run "
            "`manage.py jobguard_reencrypt`, then remove the old key. See docs/how-to/encrypt-payloads.md."
        )
