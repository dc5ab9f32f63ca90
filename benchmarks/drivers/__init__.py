"""One driver per system: enqueue jobs and run a worker, inside that system's virtualenv."""
