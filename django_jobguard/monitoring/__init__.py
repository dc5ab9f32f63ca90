"""Observability: what operators read (``jobguard_status``, the console, the gauges) and what reports it.

- :mod:`.stats`: queue, limit, breaker and workflow statistics, one set of indexed queries.
- :mod:`.health`: the admin's queue health page (numbers and last-hour series).
- :mod:`.beats`: worker beats and per-minute outcome counts (an event sink writes them).
- :mod:`.tuning`: observed durations and the visibility timeouts they call for.
- :mod:`.metrics`: Prometheus counters (an event sink) and the scrape-time queue collector.
- :mod:`.audit`: the consistency audit (``manage.py jobguard_audit``).
- :mod:`.sentry`: the Sentry integration, ``JobguardIntegration`` (extra ``[sentry]``).
- :mod:`.tracing`: OpenTelemetry's producer half (enqueue and workflow spans, the stored
  context); imported only with ``OPENTELEMETRY`` on. The worker's spans are
  :mod:`django_jobguard.worker.tracing`.
"""
