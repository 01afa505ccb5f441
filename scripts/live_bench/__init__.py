"""The live routing benchmark (scripts/bench_live.py): the real stack, emulated GPUs in scaled
time, a workload replayed through the API."""
