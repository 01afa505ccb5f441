"""Issue 41 item 8, the live proof of a plan: the planned fleet as emulated instances through
the real stack, the plan's workload replayed at its own arrival times, beside the planner's
predicted TTFT p99 and e2e p99 per model (`scripts/bench_plan_live.py`, docs/planning.md).

The pure parts live here: the plan's fleet as `BLOCKQ_FLEET` entries the emulated engines can
run, the workload file as a `LiveWorkload`, and the comparison rows.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.live.workloads import LiveRequest, LiveWorkload
from workers.plan import parse_workload
from workers.plan.workload import PlanInputError, PlanRequest
from workers.sim.exec_model import bundled_model_names
from workers.sim.fleet_declaration import InstanceSpec

__all__ = ["PlanLiveError", "compare_rows", "plan_fleet_specs", "plan_requests",
           "plan_workload"]

#: Token ids below this are left out of generated prompts (the tokenizer's special tokens).
_FIRST_PLAIN_ID = 16
#: What every planned entry must give for the live stack to size it as the planner did.
_SIZED = ("exec_model", "num_blocks", "max_num_seqs", "capacity_rps")


class PlanLiveError(ValueError):
    """A plan or workload the live proof cannot run (the message names the entry or line)."""


def plan_fleet_specs(plan: Mapping[str, Any], *, model_path: Path) -> list[InstanceSpec]:
    """The plan's "fleet" as emulated `BLOCKQ_FLEET` entries, each sized as the planner sized
    it. A derived kind (no bundled execution-time model) is refused, named: the emulated
    engine would run the configured default step times, not the planner's."""
    entries = plan.get("fleet")
    if not isinstance(entries, list) or not entries:
        raise PlanLiveError("plan: no \"fleet\" list (is this blockq plan's --json output?)")
    bundled = set(bundled_model_names())
    specs = []
    for number, entry in enumerate(entries, start=1):
        where = f"plan fleet entry {number} ({entry.get('model')} on {entry.get('gpu_kind')})"
        if entry.get("derived") or entry.get("exec_model") not in bundled:
            raise PlanLiveError(
                f"{where}: GPU kind {entry.get('gpu_kind')!r} runs a derived execution-time "
                f"model ({entry.get('exec_model')}), which no emulated engine bundles; plan "
                f"with profiled kinds only (bundled: {', '.join(sorted(bundled))})")
        missing = [k for k in _SIZED if entry.get(k) is None]
        if missing:
            raise PlanLiveError(f"{where}: missing {', '.join(missing)}")
        specs.append(InstanceSpec(
            model=entry["model"], count=int(entry["count"]), gpu_kind=entry["gpu_kind"],
            engine="emulated", exec_model=entry["exec_model"],
            num_blocks=int(entry["num_blocks"]), max_num_seqs=int(entry["max_num_seqs"]),
            capacity_rps=float(entry["capacity_rps"]), model_path=model_path))
    return specs


def plan_requests(lines: Iterable[str], source: str = "workload") -> list[PlanRequest]:
    """The workload file's requests in file order (checked as `blockq plan` checks it)."""
    lines = list(lines)
    try:
        parse_workload(lines, source)
    except PlanInputError as error:
        raise PlanLiveError(str(error)) from None
    return [PlanRequest.model_validate(json.loads(line)) for line in lines if line.strip()]


def plan_workload(requests: Sequence[PlanRequest], *, max_model_len: int, seed: int,
                  decode: Callable[[list[int]], str], vocab_size: int,
                  learned: Callable[[list[int]], list[int]] | None) -> LiveWorkload:
    """The plan's requests as the live benchmark sends them: random token-id prompts of each
    request's length, the true output length as the emulated engine's answer (capped at the
    context, as the planner caps it), each request's model, and arrivals from the file kept as
    they are (origin moved to the first; sent at rate 1, so emulated seconds = the file's).
    `learned(true_lengths)` draws the router's predicted lengths; it is called once per model
    on that model's requests in file order, as the planner's simulation draws per pool."""
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    origin = requests[order[0]].arrival_s
    predicted: dict[int, int | None] = {i: None for i in order}
    if learned is not None:
        for model in dict.fromkeys(requests[i].model for i in order):
            mine = [i for i in order if requests[i].model == model]
            outputs = [_capped(requests[i], max_model_len) for i in mine]
            predicted.update(zip(mine, learned(outputs), strict=True))
    rng = random.Random(seed)
    live, seen = [], set()
    for i in order:
        r = requests[i]
        if r.prompt_tokens >= max_model_len:
            raise PlanLiveError(f"workload request {i + 1}: prompt of {r.prompt_tokens} tokens "
                                f"does not fit max_model_len {max_model_len}")
        while True:
            ids = [rng.randrange(_FIRST_PLAIN_ID, vocab_size) for _ in range(r.prompt_tokens)]
            key = decode(ids)  # as domain.commands stores it: the tables' key
            if key not in seen:
                break
        seen.add(key)
        room = max_model_len - r.prompt_tokens
        live.append(LiveRequest(ids, key, r.prompt_tokens, _capped(r, max_model_len),
                                predicted[i], room, model=r.model))
    counts = {m: sum(1 for q in live if q.model == m) for m in dict.fromkeys(q.model for q in live)}
    notes = ["plan workload: " + ", ".join(f"{m} {n}" for m, n in counts.items())
             + f" requests over {requests[order[-1]].arrival_s - origin:.0f} s, the file's "
             "arrivals; prompts as random token ids"
             + ("; block's lengths: learned-errors draws" if learned is not None else "")]
    return LiveWorkload("plan", live, [requests[i].arrival_s - origin for i in order],
                        "tiny-llama", None, learned_live=False, notes=notes)


def _capped(request: PlanRequest, max_model_len: int) -> int:
    return max(1, min(request.output_tokens, max_model_len - request.prompt_tokens))


def compare_rows(predicted: Mapping[str, Mapping[str, Any]],
                 live: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per model of the plan: live and predicted TTFT p99 and e2e p99 (emulated s) and the
    ratio live / predicted (None where either is missing), and the live p99 from acceptance
    to routing (the control plane's part of the TTFT)."""
    rows = []
    for model, figures in predicted.items():
        mine = live.get(model, {})
        row: dict[str, Any] = {"model": model, "requests": mine.get("requests", 0)}
        for name, live_key in (("ttft_p99_s", "ttft_s"), ("e2e_p99_s", "e2e_s")):
            want = figures.get(name)
            got = (mine.get(live_key) or {}).get("p99")
            row[name] = {"live": got, "predicted": want,
                         "ratio": (got / want if _finite(got) and _finite(want) and want > 0
                                   else None)}
        row["accept_to_routed_p99_s"] = (mine.get("accept_to_routed_s") or {}).get("p99")
        rows.append(row)
    return rows


def instance_shares(models: Sequence[str | None], samples: Sequence[Sequence[Any]]
                    ) -> dict[str, dict[str, int]]:
    """Per model, how many of its requests each instance served (a live point's `samples`,
    whose first field indexes `models` and whose last is the instance): round robin's turns
    give each an equal share."""
    shares: dict[str, dict[str, int]] = {}
    for sample in samples:
        model, instance = models[sample[0]], sample[-1]
        if model is not None and instance is not None:
            per = shares.setdefault(model, {})
            per[instance] = per.get(instance, 0) + 1
    return {m: dict(sorted(per.items())) for m, per in shares.items()}


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)
