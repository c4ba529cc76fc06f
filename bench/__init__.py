"""Benchmarks: ``make bench`` (``python -m bench``) prints one table, each row's rate beside the
raw confluent-kafka rate for the same records measured in the same run.

Each case runs in its own subprocess so its peak RSS is its own. A case is a function in
``bench.cases`` registered with ``@case(name, baseline=...)``; it receives a ``BenchEnv`` and
returns the number of items it processed (the harness times it).
"""
