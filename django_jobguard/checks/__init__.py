"""Django system checks (``jobguard.E0xx`` errors, ``jobguard.W0xx`` warnings).

IDs are listed in docs/reference/checks.md; a retired ID is never reused.

Each module registers its checks with Django when it is imported (the app's ``ready()``
imports this package): :mod:`.settings` (the setting itself, the API, replay approval),
:mod:`.database` (the job store's database and poolers), :mod:`.caches` (locks, the wake-up,
durable invalidation), :mod:`.declared_schedules` (recurring jobs), :mod:`.outbox` (the outbox's
destinations), :mod:`.tasks` (the registered
tasks and the checklist) and :mod:`.encryption` (keys for the tasks that encrypt, and for
the values stored).
"""

from . import caches, database, declared_schedules, encryption, outbox, settings, tasks

__all__ = ["caches", "database", "declared_schedules", "encryption", "outbox", "settings", "tasks"]
