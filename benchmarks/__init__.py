"""hippo_gpu's benchmarks: scripts that print a table and append a JSON line to results/.

Run one as a module from the repository root, e.g. ``python -m benchmarks.bench_ppr --help``;
what they share (threads, data, the musique index, provenance, timing) is benchmarks.common.
"""
