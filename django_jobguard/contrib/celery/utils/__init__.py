"""Counterparts of the helpers a Celery project imports from ``celery.utils`` (``log``, ``time``)."""
