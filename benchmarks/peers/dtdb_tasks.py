"""The no-op task for django-tasks (django-tasks-db back end)."""

from django_tasks import task


@task()
def noop(i: int) -> None:
    return None
