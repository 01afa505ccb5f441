"""Live routing benchmark: the real stack (API, PostgreSQL, Redis, Celery predict and route
workers) in front of emulated Qwen2-7B/A30 instances in scaled time, a workload replayed
through the API, TTFT and end-to-end latency per policy, and the capacity at a TTFT p99 SLO.

Method, settings and results: docs/benchmarks_live.md. Every latency and rate is in emulated
time (wall / time scale). Each (policy, rate) point runs on a fresh stack, database and Redis
database. Needs `scripts/make_live_workload.py` for the "conversations" workload.

    .venv/bin/python scripts/bench_live.py --smoke                       # ~5 min quiet
    .venv/bin/python scripts/bench_live.py --json live.json              # full: many hours
    .venv/bin/python scripts/bench_live.py --replot live.json            # tables + plots again

`--fleet JSON` (issue 31) runs a fleet of unlike emulated instances in the `BLOCKQ_FLEET` format
instead of `--instances` alike ones: each instance is declared as the discrete-event benchmark
runs it (`workers.cluster_sim.declared_fleet`: its hardware's KV blocks and max_num_seqs, and its
capacity on this workload, capacity_weighted's weight), so `--around-sim` compares like with
like. A measurement runs alone: the benchmark takes the test services' lock
(`live_bench.quiet`) and prints the load average at its start and end.
"""

from benchmarks.live.run import main

if __name__ == "__main__":
    raise SystemExit(main())
