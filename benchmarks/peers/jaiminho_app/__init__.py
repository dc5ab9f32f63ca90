"""django-jaiminho, the peer outbox library of ``bench_outbox.py``, run in ``benchmarks/.venv-jaiminho``."""
