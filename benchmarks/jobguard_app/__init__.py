"""The benchmark's no-op tasks for django-jobguard (discovered from tasks.py like any app's)."""
