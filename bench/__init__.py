"""Benchmarks: ``make bench`` (``rhumbatron bench``, ``python -m bench``) prints one table, each row
beside its baseline measured in the same run (docs/performance.md).

A case is a function registered with ``@case(name, setup=...)`` (bench.harness); it receives a
``BenchEnv``, does its own timing and returns the rows it measured (bench.rows). Each case runs
in a child process of its own, once per round, so its peak RSS is its own.
"""
