"""Benchmarks of django-jobguard against its peers (run ``make bench``; see benchmarks/README.md)."""
