"""``manage.py jobguard_audit``: look for job, key and dead-letter rows that disagree; exit 1 if any."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from ...monitoring.audit import DEFAULT_GRACE_SECONDS, Finding, audit
from ._options import add_database_argument, database_alias, non_negative_float


class Command(BaseCommand):
    help = (
        "Check the jobs, idempotency keys and dead letters for states the engine never writes "
        "(or not for long): expired leases nobody reaps, dead jobs without a dead letter, keys "
        "that disagree with their job, approved replays left waiting. Exits 1 if anything is found."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON for scripts instead of text.")
        parser.add_argument(
            "--grace",
            type=non_negative_float,
            default=DEFAULT_GRACE_SECONDS,
            metavar="SECONDS",
            help=(
                "How long a lease may stay expired, or an approved replay wait, before it is "
                f"reported (default {DEFAULT_GRACE_SECONDS:g})."
            ),
        )
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options)
        findings = audit(alias, grace=options["grace"])
        found = [finding for finding in findings if not finding.ok]
        if options["json"]:
            document = {
                "checked_at": timezone.now().isoformat(),
                "database": alias,
                "grace_seconds": options["grace"],
                "ok": not found,
                "findings": [finding.as_dict() for finding in findings],
            }
            self.stdout.write(json.dumps(document, sort_keys=True))
        else:
            self._print(findings)
        if found:
            # SystemExit rather than CommandError: the report is already printed, and a
            # cron job or CI step only needs the status.
            raise SystemExit(1)

    def _print(self, findings: list[Finding]) -> None:
        for finding in findings:
            if finding.ok:
                self.stdout.write(f"ok     {finding.check}: no {finding.description}")
                continue
            more = ", ..." if finding.count > len(finding.sample) else ""
            ids = ", ".join(str(pk) for pk in finding.sample) + more
            self.stdout.write(
                self.style.ERROR(f"FOUND  {finding.check}: {finding.count} {finding.description}")
            )
            self.stdout.write(f"       {finding.model} ids: {ids}")
            self.stdout.write(f"       {finding.hint}")
        problems = sum(1 for finding in findings if not finding.ok)
        summary = "nothing found" if not problems else f"{problems} of {len(findings)} checks found rows"
        self.stdout.write(f"jobguard audit: {summary}")
