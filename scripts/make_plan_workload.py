"""Build docs/planning.md's two-model workload (`workers.plan.example`) as a `blockq plan`
workload file: chat on Llama-2-7B (ShareGPT lengths, the Azure conversation trace's arrivals)
beside bulk code completion on Llama-3-8B (the Azure code trace), from the shared traces.

Usage::

    python scripts/make_plan_workload.py --out FILE [--chat 8000 --chat-rate 20]
        [--bulk 2000 --bulk-rate 5] [--data ../shared/data]

The defaults are the 10,000-request workload of docs/planning.md; the small fixture shipped in
workers/plan/data/two_model_workload.jsonl is ``--chat 800 --bulk 200``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.paths import DATA_DIR
from workers.plan.example import two_model_requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    parser.add_argument("--chat", type=int, default=8000, help="chat requests")
    parser.add_argument("--chat-rate", type=float, default=20.0, help="chat requests a second")
    parser.add_argument("--bulk", type=int, default=2000, help="bulk requests")
    parser.add_argument("--bulk-rate", type=float, default=5.0, help="bulk requests a second")
    args = parser.parse_args()
    requests = two_model_requests(args.data, args.chat, args.chat_rate, args.bulk,
                                  args.bulk_rate)
    args.out.write_text("".join(json.dumps(r.model_dump(exclude_none=True)) + "\n"
                                for r in requests))
    print(f"wrote {len(requests)} requests to {args.out}")


if __name__ == "__main__":
    main()
