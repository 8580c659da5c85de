"""Throughput and memory of the bridge against the naive baseline and the floors, in one run.

`make bench` (or `.venv/bin/python -m benchmarks`) generates one workload (benchmarks.workload),
times every conversion on it in the same process, chunk by chunk, with the cases interleaved and
repeated (best of N per chunk), so that ratios hold even when other processes load the CPU.
It then runs the Spark transform and the CLI's memory check, prints a table, and writes
`benchmarks/results.json` and `docs/performance.md` (with `docs/performance.png` when matplotlib
is installed). A quick run:

    .venv/bin/python -m benchmarks --rows 2000 --skip-rss --skip-spark

The benchmarks are not part of `make test`, and nothing in `bridge` imports them.
"""
