"""What an operator does to the fleet by hand: the verbs behind the admin, the API and the commands.

Each verb checks its input, writes its change in one transaction (with its audit row where
there is one, as a queue's ``QueueEvent``) and logs it on its area's logger; the surfaces
check permissions and call it, so the admin, the API and the commands follow the same rules.

- :mod:`.queues`: pause and resume a queue (``jobguard.pause_queue``).
- :mod:`.jobs`: cancel jobs, ask running ones to stop, re-queue cancelled ones, make
  waiting ones due now.
- :mod:`.workflows`: cancel a workflow, retry its failed members.

The verbs that live with the rules they change stay there: a breaker opened or closed by hand
(:mod:`django_jobguard.breakers`), a schedule paused, resumed or run now
(:mod:`django_jobguard.schedules`), a replay requested, approved or rejected
(:mod:`django_jobguard.dlq`) and a lock released by force (:mod:`django_jobguard.locks.release`).
"""
