"""The example shop's demo: acts (acts.py), the live display (display.py), the runner (runner.py)."""
