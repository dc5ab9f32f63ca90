"""What operators read: the read models behind ``jobguard_status``, the console and the gauges.

- :mod:`.stats`: queue, limit, breaker and workflow statistics, one set of indexed queries.
- :mod:`.health`: the admin's queue health page (numbers and last-hour series).
- :mod:`.beats`: worker beats and per-minute outcome counts (an event sink writes them).
- :mod:`.tuning`: observed durations and the visibility timeouts they call for.
"""
