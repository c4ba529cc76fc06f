"""The subscription runtime: every subscription runs on it (see runner.py for the loop)."""
