"""Benchmarks: halfmoon's store measured beside peers run on the same machine.

``python -m bench.store_bench`` (or ``./run bench``) prints a table of
append and read throughput for the store, the raw disk and SQLite, with
ratios and the targets of the store's issue. Results and their analysis live
in ``docs/benchmarks.md``.
"""
