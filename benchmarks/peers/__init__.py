"""The peers' side of the benchmarks: settings, apps and tasks (run in benchmarks/.venv-peers)."""
