"""Issue 41 item 8, the live proof of a plan: `blockq plan`'s fleet as emulated instances
through the real stack (API, PostgreSQL, Redis, Celery predict and route workers), the plan's
workload replayed at its own arrival times in scaled time, under the production default routing
policies; each model's live TTFT p99 and e2e p99 beside the planner's prediction.

    .venv/bin/python scripts/bench_plan_live.py --plan plan.json --workload workload.jsonl \
        --time-scale 4 [--json out.json]

Every latency is in emulated seconds (wall / time scale). Only profiled GPU kinds can run:
a plan with a derived kind is refused. A measurement runs alone: the script takes the test
services' lock and prints the load average at its start and end (docs/plan_live.md).
"""

from benchmarks.plan_live_run import main

if __name__ == "__main__":
    raise SystemExit(main())
