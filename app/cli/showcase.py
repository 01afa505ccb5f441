"""The demo's routing showcase: one stream of real prompts replayed through the whole pipeline
(API, predict, route, engine workers) on a small mixed fleet of emulated GPU instances (fast and
slow), once under each of round_robin, least_requests (what any load balancer does) and the
policy blockq routes a mixed fleet with by default (`mixed_fleet_routing_policy`, block_slo),
side by side; then once more under that policy with a bulk batch of other real prompts beside it
(app/cli/showcase_batch.py).

The data (app/demo/):

- ``showcase_prompts.jsonl``: 167 real prompts, each with one real answer's length in Qwen tokens
  (``{"prompt", "output_tokens", "source_model"}``): the held-out replay prompts of
  ``scripts/make_live_workload.py --seed 0 --test-share 0.2`` (Arena-Hard, arena-bench and
  ShareGPT conversations, split by prompt), fields trimmed.
- ``showcase_length_model.npz``: the length model that script trained on the other 80 % of the
  prompts, with the shipped model's recipe. The shipped bootstrap model trained on all the
  conversations, these prompts included, so the showcase predicts with this one: its length error
  is measured on prompts it never saw.

The emulated engines generate each prompt's real answer length (``emulated_output_lengths
answers``) and run vLLM's scheduling model in real time, each with its own hardware's
execution-time model (a `BLOCKQ_FLEET` entry's ``exec_model``, which the router's what-ifs
simulate it with too). Every request asks for the whole room (max_tokens = max_model_len -
prompt tokens), so max_tokens never reveals the true length. The bias watch is off (as in the
live benchmark): each policy is measured as configured, without the fallback to round robin.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from app.cli.demo import TERMINAL
from app.cli.showcase_batch import BatchRun, BatchWatcher, batch_table, start_batch
from domain.settings import Settings
from workers.sim.fleet_declaration import InstanceSpec, parse_fleet
from workers.sim.hardware import deployment

__all__ = [
    "FLEET", "LengthScores", "PassResult", "ShowcaseFleet", "ShowcasePrompt", "ShowcaseResult",
    "StreamRequest",
    "build_stream", "length_scores", "length_table", "load_showcase_prompts", "run_pass",
    "run_showcase", "showcase_policies", "showcase_settings", "showcase_table",
]

#: The policies the predictive one is compared with, in the order they run (it runs last).
BASELINES = ("round_robin", "least_requests")


@dataclass(frozen=True)
class ShowcaseFleet:
    """The showcase's fleet and stream: two fast instances and two slow ones, sized so that the
    instances queue at the peaks of a Poisson stream (where placement matters) and one pass
    takes well under a minute.

    NOTE: sized with the discrete-event simulator (workers/cluster_sim `simulate` on this fleet,
    `ClusterSetup.of_fleet`, max_num_seqs 8 and 1,052 KV blocks each; the showcase's stream, its
    prompt lengths by the demo's tokenizer and this length model's predictions; step noise 0.05,
    states published every 0.1 s; the figures: docs/measurements.md, "The demo's showcase").
    round_robin's first tokens come late; least_requests balances request counts, so its first
    tokens come about as soon as block_slo's, but it still gives the slow A30s about a third of
    the stream, long answers included, where an H100's decode step takes about a third of
    theirs (workers/sim/models): what a newcomer sees is the end-to-end latency. (On 2 x A100 +
    2 x A30 the gap is narrower.) 4 req/s rather than the identical-A30 showcase's 3, so that
    four passes take about as long as its three did; a low rate on small instances, rather than
    many requests on large ones, because the control plane shares the demo machine's CPUs with
    the emulated engines (at twice the rate a loaded 2-core machine's predictor fell behind under
    block's what-ifs). Every instance has the
    A30's 1,052 KV blocks (`emulated_num_blocks`), so that the H100s have no more cache than the
    A30s (where block's end-to-end objective collapses and block_slo does not,
    docs/benchmarks_cluster.md); no run above preempted."""

    #: (execution-time model, instances) in queue order: gpu.0 and gpu.1 fast, then the slow.
    hardware: tuple[tuple[str, int], ...] = (("llama-2-7b-h100", 2), ("llama-2-7b-a30", 2))
    max_num_seqs: int = 8
    num_blocks: int = 1052  # Llama-2-7B on an A30 (workers/sim/hardware.py), every instance
    max_model_len: int = 4096
    requests: int = 100
    rate: float = 4.0  # requests per (emulated) second
    #: Wall seconds per emulated second (1: real time).
    time_scale: float = 1.0
    seed: int = 0
    #: Lines of the bulk batch that runs beside the stream in the last pass.
    batch_lines: int = 48
    #: Interactive TTFT p99 (s) that the batch's release window steers by
    #: (workers/batch/headroom.py): the batch takes only the room the stream leaves.
    batch_ttft_target_s: float = 1.0
    #: Seats of each engine kept for interactive requests while the batch runs
    #: (engine_interactive_seats), with batch prefills last (engine_batch_prefill_last).
    #: NOTE: simulated on the showcase's earlier fleet, 4 A30s of 8 seats (docs/benchmarks.md,
    #: "Batch work that yields"; figures in docs/measurements.md): 3 seats kept let the batch
    #: use about twice the free capacity 4 do, for a TTFT tail a few times the stream's alone.
    #: The stream alone holds about 5 of 8 seats.
    interactive_seats: int = 3

    @property
    def instances(self) -> int:
        return sum(count for _, count in self.hardware)

    def specs(self, model: str, model_path: Path) -> tuple[InstanceSpec, ...]:
        """The fleet as `BLOCKQ_FLEET` declares it (counts expanded): every instance an
        emulated engine serving `model`, counting tokens with `model_path`'s tokenizer."""
        return tuple(parse_fleet(json.dumps([
            {"model": model, "model_path": str(model_path), "engine": "emulated",
             "exec_model": exec_model, "count": count} for exec_model, count in self.hardware])))

    def groups(self) -> list[tuple[str, list[str]]]:
        """("2 x H100", [its instance ids]) per hardware entry, in queue order."""
        groups, first = [], 0
        for exec_model, count in self.hardware:
            groups.append((f"{count} x {deployment(exec_model).gpu.name.upper()}",
                           [f"gpu.{k}" for k in range(first, first + count)]))
            first += count
        return groups

    def describe(self) -> str:
        """``2 x H100 + 2 x A30 (llama-2-7b)``."""
        models = dict.fromkeys(deployment(name).model.name for name, _ in self.hardware)
        return f"{' + '.join(label for label, _ in self.groups())} ({', '.join(models)})"


FLEET = ShowcaseFleet()


def showcase_policies(settings: Settings) -> tuple[str, ...]:
    """The policies the showcase runs, in order: the baselines, then the one blockq routes a
    mixed fleet with by default (`mixed_fleet_routing_policy`)."""
    return tuple(dict.fromkeys((*BASELINES, settings.mixed_fleet_routing_policy)))


@dataclass(frozen=True)
class ShowcasePrompt:
    prompt: str
    #: The real answer's length: what the emulated engine generates.
    output_tokens: int
    source_model: str


@dataclass(frozen=True)
class StreamRequest:
    prompt: ShowcasePrompt
    #: Emulated seconds after the first arrival.
    arrival_s: float


def load_showcase_prompts() -> list[ShowcasePrompt]:
    text = resources.files("app.demo").joinpath("showcase_prompts.jsonl").read_text()
    return [ShowcasePrompt(r["prompt"], int(r["output_tokens"]), r["source_model"])
            for line in text.splitlines() if line.strip() for r in [json.loads(line)]]


def model_path() -> Path:
    """The held-out length model (module docstring), as a file the predict worker can load."""
    return Path(str(resources.files("app.demo").joinpath("showcase_length_model.npz")))


def build_stream(prompts: list[ShowcasePrompt], *, num_requests: int, rate: float,
                 seed: int) -> list[StreamRequest]:
    """`num_requests` prompts in a seeded order (each once before any repeats), with Poisson
    arrivals at `rate` per second, the first at 0. The same arguments give the same stream."""
    if num_requests < 1 or not prompts or rate <= 0:
        raise ValueError("need prompts, at least one request and a positive rate")
    rng = np.random.default_rng(seed)
    order: list[int] = []
    while len(order) < num_requests:
        order += rng.permutation(len(prompts)).tolist()
    gaps = rng.exponential(1.0 / rate, num_requests)
    gaps[0] = 0.0
    return [StreamRequest(prompts[i], float(t))
            for i, t in zip(order[:num_requests], np.cumsum(gaps), strict=True)]


def showcase_settings(base: Settings, answers_path: Path, fleet: ShowcaseFleet = FLEET) -> Settings:
    """The emulated fleet's settings: the demo's services and ports, its own data directory."""
    return base.model_copy(update={
        "data_dir": base.data_dir / "showcase",
        # The tokenizer (prompt lengths) is the demo's model's, wherever its data dir is.
        "model_path": base.resolved_model_path,
        # Each instance's hardware is its fleet entry's exec_model (the engine emulates it, its
        # state publishes it, the router's what-ifs simulate it).
        "fleet": fleet.specs(base.model_name, base.resolved_model_path),
        "num_instances": fleet.instances, "engine_kind": "emulated",
        "emulated_num_blocks": fleet.num_blocks,
        "block_size": 16, "max_num_seqs": fleet.max_num_seqs, "max_num_batched_tokens": 512,
        "max_model_len": fleet.max_model_len, "emulated_time_scale": fleet.time_scale,
        "emulated_output_lengths": "answers", "emulated_answers_path": answers_path,
        "routing_policy": base.mixed_fleet_routing_policy, "length_predictor": "learned",
        # The held-out head on both paths (the shipped ones saw the showcase's prompts).
        "length_model_path": model_path(), "length_fast_model_path": model_path(),
        # The router simulates the engines' own execution-time model, the predictor keeps its
        # model (no refits mid-run), and no fallback to round robin: each policy as configured.
        "learn_retrain_interval_s": 0, "learn_refit_interval_s": 0,
        "bias_threshold": 1e9, "bias_correction_rate": 0.0,
        # Batch work yields: its window of lines in flight grows while the stream's TTFT p99
        # meets the target and halves when it does not, within the slots the stream leaves
        # (batch_headroom_slot_margin); engines run interactive requests first regardless, keep
        # seats for them and put batch prefills after theirs.
        "batch_headroom_ttft_s": fleet.batch_ttft_target_s, "batch_headroom_window_s": 10.0,
        "batch_headroom_min_window": 1, "batch_headroom_increase": 2.0,
        "max_batch_in_flight": fleet.instances * fleet.max_num_seqs,
        "engine_interactive_seats": fleet.interactive_seats, "engine_batch_prefill_last": True,
        "batch_release_interval_s": 0.5,
    })


def write_answers(path: Path, prompts: list[ShowcasePrompt]) -> Path:
    """The emulated engines' answer table: prompt -> the real answer's length."""
    with path.open("w", encoding="utf-8") as handle:
        for p in prompts:
            handle.write(json.dumps({"prompt": p.prompt, "output_tokens": p.output_tokens},
                                    ensure_ascii=False) + "\n")
    return path


def run_pass(client: httpx.Client, admin: httpx.Client, policy: str,
             stream: list[StreamRequest], *, count_tokens: Callable[[str], int],
             fleet: ShowcaseFleet, progress: Progress, label: str | None = None,
             timeout_s: float = 300) -> list[dict[str, Any]]:
    """Switch every router to `policy`, send the stream at its arrival times, wait until every
    request is terminal; the final request objects, in stream order."""
    admin.put("/v1/admin/routing", json={"policy": policy}).raise_for_status()
    label = label or policy
    ids: list[str | None] = [None] * len(stream)
    rooms = [fleet.max_model_len - count_tokens(r.prompt.prompt) for r in stream]  # one thread
    sending = progress.add_task(f"{label}: sending", total=len(stream))
    started = time.monotonic() + 0.2

    def send(i: int) -> None:
        request = stream[i]
        time.sleep(max(0.0, started + request.arrival_s * fleet.time_scale - time.monotonic()))
        answer = client.post("/v1/requests", json={"prompt": request.prompt.prompt,
                                                   "max_tokens": rooms[i], "temperature": 0})
        answer.raise_for_status()
        ids[i] = answer.json()["id"]
        progress.advance(sending)

    with ThreadPoolExecutor(len(stream)) as pool:
        sender = threading.Thread(target=lambda: list(pool.map(send, range(len(stream)))),
                                  daemon=True)
        sender.start()
        done = _wait(client, ids, sender, progress.add_task(f"{label}: finished",
                                                            total=len(stream)), progress,
                     time.monotonic() + timeout_s)
    return [done[request_id] for request_id in ids if request_id is not None]


def _wait(client: httpx.Client, ids: list[str | None], sender: threading.Thread, task: Any,
          progress: Progress, deadline: float) -> dict[str, dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    while (sender.is_alive() or len(done) < len(ids)) and time.monotonic() < deadline:
        time.sleep(1.0)
        for request_id in list(ids):
            if request_id is not None and request_id not in done:
                body = client.get(f"/v1/requests/{request_id}").json()
                if body["status"] in TERMINAL:
                    done[request_id] = body
        progress.update(task, completed=len(done))
    if len(done) < len(ids):
        raise TimeoutError(f"{len(ids) - len(done)} showcase requests unfinished")
    return done


def _seconds(later: str | None, earlier: str | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()


@dataclass(frozen=True)
class PassResult:
    """One pass, latencies in emulated seconds."""

    policy: str
    succeeded: int
    total: int
    ttft_s: list[float]
    e2e_s: list[float]
    predicted_tokens: list[int]
    actual_tokens: list[int]
    #: The instance each succeeded request ran on.
    instance_ids: tuple[str, ...] = ()

    @classmethod
    def of(cls, policy: str, results: list[dict[str, Any]], time_scale: float) -> PassResult:
        ok = [r for r in results if r["status"] == "succeeded"]
        ttft = [_seconds(r["first_token_at"], r["created_at"]) for r in ok]
        e2e = [_seconds(r["finished_at"], r["created_at"]) for r in ok]
        return cls(policy, len(ok), len(results),
                   [s / time_scale for s in ttft if s is not None],
                   [s / time_scale for s in e2e if s is not None],
                   [r["predicted_output_tokens"] or 0 for r in ok],
                   [r["output_tokens"] or 0 for r in ok],
                   tuple(str(r["instance_id"]) for r in ok))


@dataclass(frozen=True)
class LengthScores:
    """How well a length predictor did on the stream's requests."""

    mae_tokens: float
    median_rel_error: float
    #: Rank correlation with the true lengths (what a router ordering work relies on); None for
    #: a constant predictor, which ranks nothing.
    spearman: float | None


def length_scores(predicted: list[int], actual: list[int]) -> tuple[LengthScores, LengthScores]:
    """(the learned model, the mean-length baseline): the baseline predicts the stream's mean
    answer length for every request (known only in hindsight: a generous baseline)."""
    truth = np.maximum(np.array(actual, dtype=float), 1.0)
    learned = np.array(predicted, dtype=float)
    mean = np.full_like(truth, max(1.0, round(float(truth.mean()))))
    return _scores(learned, truth), _scores(mean, truth)


def _scores(predicted: np.ndarray, truth: np.ndarray) -> LengthScores:
    error = np.abs(predicted - truth)
    spearman = None
    if len(truth) > 1 and np.ptp(predicted) > 0 and np.ptp(truth) > 0:
        spearman = float(np.corrcoef(_ranks(predicted), _ranks(truth))[0, 1])
    return LengthScores(float(error.mean()), float(np.median(error / truth)), spearman)


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (Spearman's)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=float)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def _p(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q):.2f}" if values else "-"


def showcase_table(results: list[PassResult], fleet: ShowcaseFleet = FLEET) -> Table:
    table = Table(title=f"Routing showcase: {fleet.requests} real prompts at {fleet.rate:g} req/s "
                  f"on a mixed fleet of emulated instances, {fleet.describe()}, max_num_seqs "
                  f"{fleet.max_num_seqs}, equal KV cache; seconds are emulated")
    table.add_column("metric")
    for result in results:
        table.add_column(result.policy, justify="right")
    rows: list[tuple[str, Callable[[PassResult], str]]] = [
        ("requests succeeded", lambda r: f"{r.succeeded} / {r.total}"),
        ("TTFT p50 (s)", lambda r: _p(r.ttft_s, 50)),
        ("TTFT p99 (s)", lambda r: _p(r.ttft_s, 99)),
        ("end-to-end p50 (s)", lambda r: _p(r.e2e_s, 50)),
        ("end-to-end p99 (s)", lambda r: _p(r.e2e_s, 99)),
    ]
    for label, instance_ids in fleet.groups():
        rows.append((f"requests run on the {label}",
                     lambda r, ids=set(instance_ids): str(sum(i in ids for i in r.instance_ids))))
    for name, cell in rows:
        table.add_row(name, *(cell(r) for r in results))
    return table


def length_table(result: PassResult) -> Table:
    """The learned model against the mean-length baseline on one pass's requests."""
    learned, baseline = length_scores(result.predicted_tokens, result.actual_tokens)
    table = Table(title=f"Output-length predictions on these {len(result.actual_tokens)} "
                  "requests (prompts the model never saw)")
    table.add_column("predictor")
    for name in ("MAE (tokens)", "median rel. error", "Spearman"):
        table.add_column(name, justify="right")
    for name, scores in (("learned model (MiniLM + features)", learned),
                         ("mean-length baseline", baseline)):
        table.add_row(name, f"{scores.mae_tokens:.0f}", f"{scores.median_rel_error:.2f}",
                      "-" if scores.spearman is None else f"{scores.spearman:.2f}")
    return table


@dataclass(frozen=True)
class ShowcaseResult:
    #: One pass per policy of `showcase_policies`, in that order (the predictive one last).
    passes: list[PassResult]
    #: The stream under the predictive policy again, with the batch beside it.
    beside_batch: PassResult
    batch: BatchRun

    @property
    def predictive(self) -> PassResult:
        return self.passes[-1]


def print_showcase(result: ShowcaseResult, console: Console,
                   fleet: ShowcaseFleet = FLEET) -> None:
    alone = result.predictive
    console.print(showcase_table(result.passes, fleet))
    console.print(length_table(alone))
    console.print(
        "Every pass replays the same stream. round_robin takes turns; least_requests sends each "
        "request to the instance running and queueing the fewest (what any load balancer does: "
        f"it cannot tell a fast GPU from a slow one); {alone.policy} simulates each instance's "
        "own scheduler on its own hardware's execution-time model with the request added and "
        "sends it where its first token comes soonest (each preemption it would cause counted "
        "as a second of waiting), "
        "so long answers go where they decode fastest. The length model never saw these "
        "prompts (trained on the other 80 % of the conversations); the baseline predicts this "
        "stream's mean answer length for every request, and ranks none of them.")
    console.print(batch_table((_p(alone.ttft_s, 50), _p(alone.ttft_s, 99)),
                              (_p(result.beside_batch.ttft_s, 50),
                               _p(result.beside_batch.ttft_s, 99)), result.batch,
                              policy=alone.policy))
    console.print(
        "The batch's lines enter the pipeline through a window that grows while the stream's "
        f"TTFT p99 stays under {fleet.batch_ttft_target_s:g} s and halves when it does not, "
        "never past the engine slots the stream is expected to leave free; every engine "
        "runs interactive requests before batch ones, keeps "
        f"{fleet.interactive_seats} of its {fleet.max_num_seqs} seats for them (a burst "
        "beyond those takes the seat of a batch line, which is recomputed later) and runs "
        "batch prefills after theirs, so that the batch takes only the room the stream leaves "
        "and finishes after it.")


def run_showcase(base: Settings, prepare: Callable[[Settings], dict[str, str]],
                 console: Console, fleet: ShowcaseFleet = FLEET) -> ShowcaseResult:
    """Start the emulated fleet, run the stream under each policy, stop; the passes' results.

    `prepare(settings)`: migrations and the processes' environment (the CLI's `_prepare`)."""
    from app.cli.stack import Stack  # noqa: PLC0415 - the CLI's process supervisor
    from domain.prompts import PromptCodec  # noqa: PLC0415 - loads transformers

    prompts = load_showcase_prompts()
    stream = build_stream(prompts, num_requests=fleet.requests, rate=fleet.rate, seed=fleet.seed)
    (base.data_dir / "showcase").mkdir(parents=True, exist_ok=True)
    answers = write_answers(base.data_dir / "showcase" / "answers.jsonl", prompts)
    settings = showcase_settings(base, answers, fleet)
    migrations = logging.getLogger("alembic")
    level = migrations.level
    migrations.setLevel(logging.WARNING)  # a fresh database's dozen migrations, said once
    try:
        env = prepare(settings)
    finally:
        migrations.setLevel(level)
    stack = Stack(settings, env=env)
    try:
        started = time.monotonic()
        with console.status(f"starting {fleet.instances} emulated instances and the control "
                            "plane (the predictor loads the length model)"):
            stack.start()
            stack.supervise()
            stack.wait_ready(num_instances=fleet.instances)
        policies = showcase_policies(settings)
        console.print(f"emulated fleet ({fleet.describe()}) ready in "
                      f"{time.monotonic() - started:.0f} s: {fleet.requests} requests at "
                      f"{fleet.rate:g} req/s under {', '.join(policies)}, then under "
                      f"{policies[-1]} beside a {fleet.batch_lines}-line batch")
        key = stack.issue_api_key("showcase")
        codec = PromptCodec(settings.resolved_model_path)
        with stack.client(key) as client, stack.client() as admin, Progress() as progress:
            try:
                results = _passes(client, admin, policies, stream, codec.count, fleet, progress)
            finally:  # the override is kept (database): leave the configured policy in force
                admin.put("/v1/admin/routing", json={"policy": None})
    finally:
        with console.status("stopping the emulated fleet"):
            stack.stop()
    return results


def _passes(client: httpx.Client, admin: httpx.Client, policies: tuple[str, ...],
            stream: list[StreamRequest], count_tokens: Callable[[str], int],
            fleet: ShowcaseFleet, progress: Progress) -> ShowcaseResult:
    results = []
    for policy in policies:
        started = time.monotonic()
        done = run_pass(client, admin, policy, stream, count_tokens=count_tokens, fleet=fleet,
                        progress=progress)
        results.append(PassResult.of(policy, done, fleet.time_scale))
        progress.console.print(f"{policy}: {len(done)} requests in "
                               f"{time.monotonic() - started:.0f} s")
    beside, batch = _batch_pass(client, admin, policies[-1], stream, count_tokens, fleet,
                                progress)
    return ShowcaseResult(results, beside, batch)


def _batch_pass(client: httpx.Client, admin: httpx.Client, policy: str,
                stream: list[StreamRequest], count_tokens: Callable[[str], int],
                fleet: ShowcaseFleet, progress: Progress) -> tuple[PassResult, BatchRun]:
    """The stream again under `policy`, with a batch of other real prompts started just
    before."""
    started = time.monotonic()
    in_stream = {r.prompt.prompt for r in stream}
    others = [p.prompt for p in load_showcase_prompts() if p.prompt not in in_stream]
    prompts = (others or [r.prompt.prompt for r in stream])[:fleet.batch_lines]
    batch_id = start_batch(client, prompts, count_tokens=count_tokens,
                           max_model_len=fleet.max_model_len)
    watcher = BatchWatcher(client, batch_id, progress, lines=len(prompts),
                           time_scale=fleet.time_scale)
    watcher.start()
    label = f"{policy} beside the batch"
    done = run_pass(client, admin, policy, stream, count_tokens=count_tokens, fleet=fleet,
                    progress=progress, label=label)
    watcher.stream_ended()
    batch = watcher.result(timeout_s=300)
    progress.console.print(f"{label}: {len(done)} requests and the batch in "
                           f"{time.monotonic() - started:.0f} s")
    return PassResult.of(label, done, fleet.time_scale), batch
