"""The live routing benchmark (scripts/bench_live.py): the real stack, emulated GPUs in scaled
time, a workload replayed through the API. Its workload file is made by `benchmarks.live_workload`
(scripts/make_live_workload.py)."""
