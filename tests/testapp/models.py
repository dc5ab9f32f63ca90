"""Tables the test tasks write to, so tests can count executions and effects."""

from django.db import models


class Execution(models.Model):
    """One row per handler run (no unique key): counts raw executions, duplicates included."""

    marker = models.CharField(max_length=100, db_index=True)
    job_id = models.BigIntegerField(null=True)
    attempt = models.IntegerField(default=0)
    worker = models.CharField(max_length=128, blank=True, default="")
    pid = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.marker} job {self.job_id} attempt {self.attempt}"


class LedgerEntry(models.Model):
    """The idempotent effect: one row per business key, guarded by a unique constraint."""

    effect_key = models.CharField(max_length=100, unique=True)
    amount = models.IntegerField(default=0)
    job_id = models.BigIntegerField(null=True)

    def __str__(self) -> str:
        return self.effect_key


class Interval(models.Model):
    """When a locked handler ran on a resource, for the overlap detector."""

    resource = models.CharField(max_length=100)
    started = models.FloatField()
    ended = models.FloatField()
    pid = models.IntegerField()
    fencing_token = models.BigIntegerField(null=True)

    def __str__(self) -> str:
        return f"{self.resource} {self.started:.3f}-{self.ended:.3f}"


class ProviderCall(models.Model):
    """A fake external provider's record of requests, one row per call (duplicates included)."""

    idempotency_key = models.CharField(max_length=255, db_index=True)
    amount = models.IntegerField(default=0)
    pid = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.idempotency_key} ({self.amount})"


class FencedCounter(models.Model):
    """A resource that refuses writes from lock holders older than the last one it saw."""

    resource = models.CharField(max_length=100, unique=True)
    value = models.IntegerField(default=0)
    last_fencing_token = models.BigIntegerField(default=0)
    rejected_writes = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.resource}={self.value}"


class JobTransition(models.Model):
    """One committed change of a job's status or lease token (the reliability suite's history).

    Rows are appended by a PostgreSQL trigger that ``tests/reliability`` installs on
    ``jobguard_job`` for the length of a scenario, so the history holds exactly what
    committed, whoever wrote it and however the writer died afterwards.
    """

    job_id = models.BigIntegerField(db_index=True)
    old_status = models.CharField(max_length=16, blank=True, default="")
    new_status = models.CharField(max_length=16)
    old_token = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001 - NULL: no lease
    new_token = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001 - NULL: no lease
    attempts = models.IntegerField(default=0)
    worker_id = models.CharField(max_length=128, blank=True, default="")
    run_after = models.DateTimeField(null=True, blank=True)
    at = models.DateTimeField(help_text="Database clock when the change was made.")

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.old_status or 'new'} -> {self.new_status}"


class Tag(models.Model):
    """A label on accounts: the many-to-many side of the cache invalidation tests."""

    name = models.CharField(max_length=50, unique=True)

    def __str__(self) -> str:
        return self.name


class Account(models.Model):
    """A row whose derived values (balance, summary) are cached and invalidated on write."""

    owner = models.CharField(max_length=100)
    balance = models.IntegerField(default=0)
    revision = models.IntegerField(default=0, help_text="Bumped on every write: the cache version.")
    tags = models.ManyToManyField(Tag, blank=True, related_name="accounts")

    def __str__(self) -> str:
        return f"{self.owner}: {self.balance} (r{self.revision})"
