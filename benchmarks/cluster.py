"""Cluster benchmark: routing policies on N simulated instances, capacity under a TTFT SLO.

Replays a workload through `workers.cluster_sim` (discrete-event, no Celery): 12 vLLM instances
whose ground truth is the scheduler with the true output lengths and noisy step times, and a
router that sees only published states (refreshed every 100 ms), the requests it routed since,
and predicted output lengths. Setup as the Block paper: max_num_seqs 48, token
budget 512, block size 16, max_model_len 4096; Llama-2-7B on A30 (1052 KV blocks) and
Qwen2-7B on A30 (7289 blocks); ShareGPT lengths with Poisson arrivals, or the Azure
conversation / code traces with their real arrival times rescaled to each rate.

For every configuration (``policy`` or ``policy@predictor``) it runs a grid of rates, then
bisects towards the capacity: the highest rate whose TTFT p99 stays under each SLO. Then it
runs every configuration at round robin's capacity rate (3 s SLO) for latency CDFs and the
end-to-end comparison. Prints tables (rich, or Markdown with ``--markdown``), writes PNG plots
and, with ``--json``, every measured point.

Predicted lengths (``--predictor``, or ``policy@predictor`` per configuration): by default the
shipped length model's, never a chosen error: ``learned`` (the held-out model's predictions on
real prompts) on the ``conversations`` replay workload, and elsewhere ``learned-errors`` (the
true length times a residual drawn from that model's measured out-of-fold errors, see
``scripts/make_length_error_fixture.py``). ``lognormal:<sigma>``, ``oracle`` and ``mean`` remain.

Workloads: ``sharegpt`` (ShareGPT lengths, Poisson arrivals), ``azure_conv`` / ``azure_code``
(the Azure traces' lengths and arrivals), ``sharegpt-azure`` (ShareGPT lengths with the Azure
conversation trace's arrivals), ``conversations`` (the replay prompts of
``scripts/make_live_workload.py``, ``--replay FILE``: real prompt and answer lengths, the held-out
model's predictions, Poisson arrivals; the request order of `replay_sequence`, as the live
benchmark replays it). ``--live-settings`` is the live benchmark's setup (issue 14): 12
instances of qwen2-7b-a30, round_robin, least_requests, llumnix, block, block@oracle, block@mean,
TTFT p99 SLO 3 s, step-time noise 0.05 (the emulated engine's default); with ``--json`` the file's
``summary`` holds the capacity per configuration, keyed as the live benchmark's.

Every what-if policy run with the default predictor is also run ``@mean`` (every request told
the mean length: no prediction) and ``@oracle`` (the true length), and the capacity table shows
both beside it with its gain over ``@mean`` (issue 43: what length prediction buys;
``--no-length-variants`` skips them).

``mooncake`` (issue 15) is the Mooncake conversation trace (Kimi's production arrivals and
lengths, prompts sharing prefixes given by ``hash_ids`` of 512-token blocks): the instances run
with prefix caching on (`workers.sim.block_pool`), the router sees each request's prefix hashes
and the caches the instances publish; ``system-prompts`` (ShareGPT requests behind one of 16
shared 1,024-token system prompts, Zipf popularity) and ``chats`` (ShareGPT lengths as the turns
of multi-turn chats, each turn's prompt the previous turn's prompt and answer plus a new message)
are synthetic prefix mixes on the paper's 4096-token setup. ``--mooncake-settings`` is issue
15's comparison: 12 x
qwen2-7b-a30 at max_model_len 32768 (longer prompts dropped), ``prefix_affinity`` against
``block``, ``block_noprefix`` (the same router blind to the cache), llumnix and round robin.

``--fleet JSON`` (issue 31) replaces ``--models`` with a fleet of unlike instances in the
``BLOCKQ_FLEET`` format (`workers.sim.fleet_declaration`; the JSON text or a file holding it): each
entry's ``exec_model`` (or a ``model`` that is one) gives the instance's step times, KV blocks and
batch size (`workers.sim.hardware`), and every what-if runs on its instance's own model.
``capacity_weighted`` is told each instance's measured capacity (one instance saturated with the
workload, `with_throughputs`). ``--equal-kv`` gives every instance the settings of the one with
the fewest KV blocks (only the speed differs). The rate grid defaults to 65-100 % of the fleet's
ceiling (the sum of its instances' saturated rates); the targets table then checks the fleet
default policy (``FLEET_DEFAULT_POLICY``) against least_requests, llumnix, capacity_weighted and its
own oracle variant.

Usage::

    python scripts/bench_cluster.py --fleet '[{"model": "llama-2-7b", "count": 4,
        "exec_model": "llama-2-7b-a100"}, {"model": "llama-2-7b", "count": 8,
        "exec_model": "llama-2-7b-a30"}]' [--equal-kv] --configs ... --json OUT
    python scripts/bench_cluster.py [--models llama-2-7b-a30 qwen2-7b-a30]
        [--workload sharegpt|azure_conv|azure_code|sharegpt-azure|conversations|mooncake|
                    system-prompts|chats]
        [--replay .blockq/live_workload/requests.jsonl] [--live-settings] [--mooncake-settings]
        [--mooncake-max-model-len 4096]
        [--configs round_robin block@oracle ...]
        [--predictor learned-errors] [--rates LO:HI:STEP] [--bisect 3] [--jobs 2]
        [--num-requests 10000] [--seed 0] [--plot-dir docs/img] [--json FILE] [--markdown]
        [--all-points] [--smoke]
    python scripts/bench_cluster.py --replot FILE [--markdown] [--plot-dir docs/img]
    python scripts/bench_cluster.py --fleet FLEET --workload-file FILE [--rate-scale X]
        [--catalog FILE] [--model-map SERVED=FAMILY ...]

``--workload-file`` (issue 41) replays a `blockq plan` workload (JSONL of ``arrival_s, model,
prompt_tokens, output_tokens``) at its own arrival times, or ``--rate-scale`` times faster, on
``--fleet`` under the production default policies, each model's pool on its own requests: the
simulation the planner judged with (`workers.plan.replay_fleet`). An instance with a
``gpu_kind`` runs as the catalog's kind. The last line printed is
``{"models": {MODEL: {"ttft_p99_s", "e2e_p99_s", "requests"}}}``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import tables
from benchmarks.paths import DATA_DIR, ROOT
from benchmarks.tables import print_table
from workers.cluster_sim import (
    AZURE_CODE,
    AZURE_CONV,
    DEFAULT_PREDICTOR,
    MOONCAKE_CONV,
    SHAREGPT,
    ClusterSetup,
    RunResult,
    Workload,
    capacity_bounds,
    fleet_label,
    fleet_members,
    load_azure_trace,
    load_length_trace,
    load_mooncake_trace,
    load_replay_prompts,
    load_sharegpt_azure,
    multi_turn_workload,
    predictor_from_spec,
    replay_workload,
    saturation_rate,
    shared_prompt_workload,
    simulate,
    with_equal_kv,
    with_throughputs,
)
from workers.plan import PlanInputError, PlanOptions, load_catalog, parse_workload, replay_fleet
from workers.route.late_binding import LateBinding
from workers.route.policies import needs_what_if
from workers.sim import InstanceConfig, bundled_model
from workers.sim.fleet_declaration import FleetError, parse_fleet

#: ``../shared/data`` next to the repository checkout.
DEFAULT_DATA_DIR = DATA_DIR
DEFAULT_PLOT_DIR = ROOT / "docs" / "img"

#: KV blocks of one A30 per model (the Block paper's vLLM numbers).
NUM_BLOCKS = {"llama-2-7b-a30": 1052, "qwen2-7b-a30": 7289}
#: Default rate grids (requests/s for 12 instances): around the paper's capacities.
DEFAULT_RATES = {"llama-2-7b-a30": "20:34:2", "qwen2-7b-a30": "48:76:4"}
DEFAULT_CONFIGS = ("round_robin", "random", "least_requests", "infaas", "llumnix",
                   "least_tokens", "block", "block_ttft", "block@oracle", "block@lognormal:0.5",
                   "block@mean")
SMOKE_CONFIGS = ("round_robin", "random", "llumnix", "block", "block@oracle")
WORKLOADS = {"sharegpt": SHAREGPT, "azure_conv": AZURE_CONV, "azure_code": AZURE_CODE,
             "sharegpt-azure": SHAREGPT, "conversations": None, "mooncake": MOONCAKE_CONV,
             "system-prompts": SHAREGPT, "chats": SHAREGPT}
#: Prefix hash granularity of the synthetic prefix workloads (16 blocks of 16 tokens).
SYNTHETIC_PREFIX_TOKENS = 256
#: The model context of every workload but mooncake (the Block paper's setting).
DEFAULT_MAX_MODEL_LEN = 4096
#: Mooncake's prompts are long (mean 12k tokens): Qwen2-7B's native 32k context, prompts at or
#: over it dropped (7 % of the trace).
MOONCAKE_MAX_MODEL_LEN = 32768
MOONCAKE_MODEL = "qwen2-7b-a30"
#: Mooncake configurations (issue 15): the prefix-aware block, the same router blind to the
#: cache, the prefix-affinity baseline, and the load balancers.
MOONCAKE_CONFIGS = ("round_robin", "llumnix", "prefix_affinity", "block", "block_noprefix")
MOONCAKE_RATES = "1.5:4.5:0.5"
#: A configuration label suffix: the router does not see prefixes (`simulate`).
NOPREFIX_SUFFIX = "_noprefix"
#: A configuration label suffix: the router holds requests no instance would start soon
#: (`workers.route.late_binding`); ``+hold=Q`` sets its ``max_queueing_s`` to Q, ``+hold=Q,O``
#: also its ``overtake_s`` to O.
HOLD_SUFFIX = "+hold"
DEFAULT_REPLAY = ROOT / ".blockq" / "live_workload" / "requests.jsonl"
#: The live benchmark's fleet and configurations (issue 14; scripts/bench_live.py).
LIVE_MODEL = "qwen2-7b-a30"
LIVE_CONFIGS = ("round_robin", "least_requests", "llumnix", "block", "block@oracle",
                "block@mean")
#: Configurations of a fleet of unlike instances (issue 31).
FLEET_CONFIGS = ("round_robin", "least_requests", "llumnix", "prefix_affinity",
                 "capacity_weighted", "block", "block_ttft", "block_slo", "block@oracle",
                 "block_ttft@oracle", "block_slo@oracle")
#: The policy blockq routes a mixed fleet with by default (domain.settings' routing default for a
#: fleet); the targets table checks it.
FLEET_DEFAULT_POLICY = "block_slo"
#: Issue 31's targets for it: capacity at least these multiples of each baseline's.
FLEET_TARGETS = (("least_requests", 1.3), ("llumnix", 1.1), ("capacity_weighted", 1.05))
#: A fleet's capacity search probes no rate over this multiple of its ceiling.
FLEET_MAX_OVER_CEILING = 1.4
#: The default fleet rate grid, as shares of the fleet's ceiling.
FLEET_RATE_SHARES = (0.65, 1.0, 0.05)
#: Step-time noise of the live emulated engines (Settings.emulated_noise's default).
LIVE_EXEC_NOISE = 0.05
#: Length predictors every what-if policy is also run with (issue 43): the mean length (no
#: prediction) and the true one, so each table shows what length prediction buys.
LENGTH_VARIANTS = ("mean", "oracle")
#: The Block paper's capacities (QPS, TTFT p99 under 3 s, 12 A30s, ShareGPT).
PAPER = {
    "llama-2-7b-a30": {"block": 31.1, "block@oracle": 32.0, "llumnix": 30.6,
                       "round_robin": 26.7, "random": 26.5},
    "qwen2-7b-a30": {"block": 67.9, "block@oracle": 68.3, "llumnix": 62.0},
}


@dataclass(frozen=True, slots=True)
class Config:
    """One routed configuration: a policy and the length predictor it plans with."""

    policy: str
    predictor: str
    #: Whether the router sees the requests' prefix hashes and the published caches.
    sees_prefixes: bool = True
    #: Whether, and how, the router holds requests (None: it binds every request at once).
    late_binding: LateBinding | None = None

    @property
    def label(self) -> str:
        policy = self.policy if self.sees_prefixes else f"{self.policy}{NOPREFIX_SUFFIX}"
        if self.late_binding == LateBinding():
            policy += HOLD_SUFFIX
        elif self.late_binding is not None:
            rule = self.late_binding
            policy += f"{HOLD_SUFFIX}={rule.max_queueing_s:g}"
            if rule.overtake_s:
                policy += f",{rule.overtake_s:g}"
        return policy if self.predictor == "default" else f"{policy}@{self.predictor}"


@dataclass(frozen=True, slots=True)
class Job:
    workload: Workload
    setup: ClusterSetup
    config: Config
    predictor: str
    rate: float
    seed: int
    keep_samples: bool = False


def run_job(job: Job) -> RunResult:
    return simulate(job.workload, job.rate, job.setup, job.config.policy,
                    predictor_from_spec(job.predictor), seed=job.seed,
                    keep_samples=job.keep_samples,
                    router_sees_prefixes=job.config.sees_prefixes,
                    late_binding=job.config.late_binding)


@dataclass(slots=True)
class ModelReport:
    model: str
    rates: list[float]
    slos: list[float]
    #: (label, rate) -> result
    points: dict[tuple[str, float], RunResult] = field(default_factory=dict)
    #: label -> slo -> (passing rate, failing rate)
    bounds: dict[str, dict[float, tuple[float | None, float | None]]] = field(
        default_factory=dict)
    cdf_rate: float | None = None
    cdf: dict[str, RunResult] = field(default_factory=dict)
    #: round_robin and block at block's capacity rate (first SLO).
    block_rate: float | None = None
    at_block_rate: dict[str, RunResult] = field(default_factory=dict)
    #: The most requests/s the fleet can complete (N x one saturated instance).
    ceiling_rps: float = 0.0
    wall_s: float = 0.0

    def p99_by_rate(self, label: str) -> dict[float, float]:
        return {rate: r.ttft_p99_s for (lab, rate), r in self.points.items() if lab == label}

    def capacity(self, label: str, slo: float) -> float | None:
        return self.bounds[label][slo][0]


def parse_rates(spec: str, scale: float) -> list[float]:
    low, high, step = (float(x) for x in spec.split(":"))
    count = int(round((high - low) / step))
    return [round((low + i * step) * scale, 3) for i in range(count + 1)]


def with_length_variants(specs: Sequence[str]) -> list[str]:
    """`specs` and, after each what-if policy planning with the default predictor, its
    `LENGTH_VARIANTS` (each configuration once)."""
    out: list[str] = []
    for spec in specs:
        out.append(spec)
        cfg = parse_config(spec)
        if cfg.predictor == "default" and needs_what_if(cfg.policy):
            out.extend(f"{spec}@{variant}" for variant in LENGTH_VARIANTS)
    return list(dict.fromkeys(out))


def parse_config(spec: str) -> Config:
    """``policy[_noprefix][+hold[=Q]][@predictor]``: the inverse of `Config.label`."""
    policy, _, predictor = spec.partition("@")
    policy, held, queueing = policy.partition(HOLD_SUFFIX)
    late_binding = None
    if held:
        values = [float(v) for v in queueing.removeprefix("=").split(",")] if queueing else []
        late_binding = LateBinding(*values[:1], **(
            {"overtake_s": values[1]} if len(values) > 1 else {}))
    blind = policy.endswith(NOPREFIX_SUFFIX)
    if blind:
        policy = policy.removesuffix(NOPREFIX_SUFFIX)
    return Config(policy, predictor or "default", not blind, late_binding)


def fleet_setup(args: argparse.Namespace, workload: Workload) -> ClusterSetup:
    """`--fleet`'s instances, each told its measured capacity (`with_throughputs`)."""
    members = fleet_members(parse_fleet(args.fleet), max_model_len=args.max_model_len)
    if args.equal_kv:
        members = with_equal_kv(members)
    members = with_throughputs(members, workload)
    return ClusterSetup.of_fleet(members, publish_interval_s=args.publish_interval,
                                 exec_noise_sigma=args.exec_noise, abort_ttft_s=args.abort_ttft,
                                 ground_truth=getattr(args, "ground_truth", "ours"))


def setup_of(model: str, args: argparse.Namespace, workload: Workload) -> ClusterSetup:
    """The fleet `--fleet` declares, or `num_instances` alike instances of `model`."""
    return fleet_setup(args, workload) if args.fleet else model_setup(model, args)


def ceiling_rps(setup: ClusterSetup, workload: Workload) -> float:
    """The most requests/s the fleet can complete: its instances' saturated rates summed."""
    if setup.fleet:
        return sum(m.throughput_rps or 0.0 for m in setup.fleet)
    return setup.num_instances * saturation_rate(workload, setup.config, setup.exec_model)


def model_setup(model: str, args: argparse.Namespace) -> ClusterSetup:
    """The paper's fleet: A30 instances of `model`, vLLM settings as in the Block paper."""
    prefix_block_size = getattr(args, "prefix_block_size", 0)
    config = InstanceConfig(num_total_blocks=NUM_BLOCKS[model], block_size=16, max_num_seqs=48,
                            max_num_batched_tokens=512,
                            max_model_len=getattr(args, "max_model_len", DEFAULT_MAX_MODEL_LEN),
                            enable_prefix_caching=prefix_block_size > 0,
                            prefix_block_size=prefix_block_size)
    return ClusterSetup(args.num_instances, config, bundled_model(model),
                        publish_interval_s=args.publish_interval, exec_noise_sigma=args.exec_noise,
                        abort_ttft_s=args.abort_ttft,
                        ground_truth=getattr(args, "ground_truth", "ours"))


def make_job(workload: Workload, setup: ClusterSetup, args: argparse.Namespace, cfg: Config,
             rate: float, keep_samples: bool = False) -> Job:
    predictor = args.predictor if cfg.predictor == "default" else cfg.predictor
    return Job(workload, setup, cfg, predictor, rate, args.seed, keep_samples)


def run_model(model: str, args: argparse.Namespace, workload: Workload,
              pool: ProcessPoolExecutor) -> ModelReport:
    started = time.perf_counter()
    setup = setup_of(model, args, workload)
    configs = [parse_config(c) for c in args.configs]
    # NOTE: a finite run passes a TTFT SLO above the steady-state ceiling while its backlog is
    # short; a fleet's search stops at FLEET_MAX_OVER_CEILING x the ceiling.
    highest = math.inf
    if args.fleet:
        ceiling = ceiling_rps(setup, workload)
        highest = FLEET_MAX_OVER_CEILING * ceiling
        rates = parse_rates(args.rates or fleet_rates(ceiling), 1.0)
    else:
        rates = parse_rates(args.rates or DEFAULT_RATES[model], args.num_instances / 12)
    step = rates[1] - rates[0] if len(rates) > 1 else rates[0] / 4
    tolerance = step / 2 ** args.bisect
    report = ModelReport(model, rates, list(args.slo))

    def job(cfg: Config, rate: float) -> Job:
        return make_job(workload, setup, args, cfg, rate)

    def run_round(wanted: Sequence[tuple[Config, float]]) -> None:
        todo = [(c, r) for c, r in dict.fromkeys(wanted) if (c.label, r) not in report.points]
        # NOTE: simulating policies take several times longer: start them first.
        todo.sort(key=lambda point: not needs_what_if(point[0].policy))
        results = pool.map(run_job, [job(c, r) for c, r in todo])
        for (cfg, rate), result in zip(todo, results, strict=True):
            report.points[(cfg.label, rate)] = result
            status = "aborted" if result.aborted else f"ttft p99 {result.ttft_p99_s:7.2f}s"
            print(f"  {model} {cfg.label:<24} {rate:7.2f}/s  {status}  ({result.wall_s:.0f}s)",
                  flush=True)

    run_round([(c, r) for r in rates for c in configs])
    for _ in range(args.bisect + 8):
        wanted = []
        for cfg in configs:
            p99 = report.p99_by_rate(cfg.label)
            for slo in args.slo:
                low, high = capacity_bounds(p99, slo)
                if high is None:
                    if max(p99) + step <= highest:
                        wanted.append((cfg, round(max(p99) + step, 3)))
                elif low is None:
                    if min(p99) - step > 0:
                        wanted.append((cfg, round(min(p99) - step, 3)))
                elif high - low > tolerance * 1.01:
                    wanted.append((cfg, round((low + high) / 2, 3)))
        if not wanted:
            break
        run_round(wanted)
    for cfg in configs:
        p99 = report.p99_by_rate(cfg.label)
        report.bounds[cfg.label] = {slo: capacity_bounds(p99, slo) for slo in args.slo}
    if getattr(args, "no_cdf", False):
        report.ceiling_rps = ceiling_rps(setup, workload)
        report.wall_s = time.perf_counter() - started
        return report
    run_cdf(report, args, workload, setup, pool)
    block = parse_config("block")
    if block in configs and report.capacity("block", args.slo[0]) is not None:
        report.block_rate = report.capacity("block", args.slo[0])
        pair = [c for c in configs if c.label in ("round_robin", "block")]
        results = pool.map(run_job, [job(c, report.block_rate) for c in pair])
        for cfg, result in zip(pair, results, strict=True):
            report.at_block_rate[cfg.label] = result
    report.ceiling_rps = ceiling_rps(setup, workload)
    report.wall_s = time.perf_counter() - started
    return report


def fleet_rates(ceiling: float) -> str:
    """The default rate grid of a fleet: `FLEET_RATE_SHARES` of its ceiling, 0.5 req/s steps at
    the finest."""
    low, high, step = (share * ceiling for share in FLEET_RATE_SHARES)
    step = max(0.5, round(step * 2) / 2)
    return f"{round(low * 2) / 2}:{round(high * 2) / 2}:{step}"


def run_cdf(report: ModelReport, args: argparse.Namespace, workload: Workload,
            setup: ClusterSetup, pool: ProcessPoolExecutor) -> None:
    """Every configuration at round robin's capacity (first SLO), keeping per-request latencies;
    with a fleet, at 80 % of the fleet default policy's capacity (issue 31's point)."""
    if args.fleet and report.bounds.get(FLEET_DEFAULT_POLICY, {}).get(args.slo[0], (None,))[0]:
        report.cdf_rate = round(0.8 * report.capacity(FLEET_DEFAULT_POLICY, args.slo[0]), 3)
    elif "round_robin" in report.bounds and report.capacity("round_robin", args.slo[0]):
        report.cdf_rate = report.capacity("round_robin", args.slo[0])
    else:
        return
    configs = [parse_config(label) for label in report.bounds]
    jobs = [make_job(workload, setup, args, c, report.cdf_rate, keep_samples=True)
            for c in configs]
    for cfg, result in zip(configs, pool.map(run_job, jobs), strict=True):
        report.cdf[cfg.label] = result


def load_reports(path: Path) -> tuple[argparse.Namespace, list[ModelReport]]:
    """The arguments and reports a ``--json`` file holds (per-request latencies excepted)."""
    data = json.loads(path.read_text())
    args = argparse.Namespace(**data["args"])
    args.data, args.plot_dir = Path(args.data), Path(args.plot_dir)
    reports = []
    for m in data["models"]:
        bounds = {label: {float(slo): (b[0], b[1]) for slo, b in slos.items()}
                  for label, slos in m["capacity"].items()}
        report = ModelReport(m["model"], [], list(args.slo), bounds=bounds,
                             cdf_rate=m["cdf_rate"], block_rate=m.get("block_rate"),
                             ceiling_rps=m.get("ceiling_rps", 0.0))
        for point in m["points"]:
            label = point.pop("config")
            report.points[(label, point["rate"])] = result_from_json(point)
        report.at_block_rate = {label: result_from_json(p)
                                for label, p in m.get("at_block_rate", {}).items()}
        reports.append(report)
    return args, reports


def result_from_json(point: dict) -> RunResult:
    values = dict(point)
    for key, value in values.items():
        if value is None:
            values[key] = math.inf if key.endswith("_s") else math.nan
    return RunResult(**values)


# -- output ------------------------------------------------------------------------------------

def fmt(value: float | None, digits: int = 2) -> str:
    """A table cell; an infinite value (no rate passed) reads "overload"."""
    return tables.fmt(value, digits, inf="overload")


def capacity_rows(report: ModelReport, labels: Sequence[str],
                  paper: dict[str, float]) -> list[list[str]]:
    slo = report.slos[0]
    base = {b: report.capacity(b, slo) for b in ("round_robin", "random") if b in report.bounds}
    rows = []
    for label in labels:
        caps = [report.capacity(label, s) for s in report.slos]
        cells = [label, *[_capacity_cell(report, label, s) for s in report.slos]]
        for name in ("round_robin", "random"):
            ref = base.get(name)
            cells.append(f"{(caps[0] / ref - 1) * 100:+.1f}%" if caps[0] and ref else "-")
        cells.extend(_variant_cells(report, label, caps[0]))
        cells.append(fmt(paper.get(label), 1))
        rows.append(cells)
    return rows


def _variant_cells(report: ModelReport, label: str, capacity: float | None) -> list[str]:
    """The headline capacity of `label`'s @mean and @oracle variants, and its own against
    @mean's: what length prediction buys that policy ("-" where not run)."""
    slo = report.slos[0]
    found = {v: report.capacity(f"{label}@{v}", slo) if f"{label}@{v}" in report.bounds
             else None for v in LENGTH_VARIANTS}
    mean = found["mean"]
    gain = f"{(capacity / mean - 1) * 100:+.1f}%" if capacity and mean else "-"
    return [*(_capacity_cell(report, f"{label}@{v}", slo) if f"{label}@{v}" in report.bounds
              else "-" for v in LENGTH_VARIANTS), gain]


def _capacity_cell(report: ModelReport, label: str, slo: float) -> str:
    low, high = report.bounds[label][slo]
    if low is None:
        return f"< {fmt(high)}"
    # A finite run passing above the steady-state ceiling: the backlog had no time to build.
    over = " (over ceiling)" if report.ceiling_rps and low > report.ceiling_rps else ""
    if high is None:
        return f">= {fmt(low)}{over}"
    return fmt(low) + over


def point_rows(results: dict[str, RunResult]) -> list[list[str]]:
    rows = []
    for label, r in results.items():
        rows.append([label, fmt(r.ttft_p50_s), fmt(r.ttft_p99_s), fmt(r.e2e_p50_s),
                     fmt(r.e2e_p99_s), fmt(r.throughput_rps), str(r.num_preemptions),
                     fmt(r.decision_us_p50, 0), fmt(r.e2e_prediction_error_p50 * 100, 1),
                     fmt(r.prefix_hit_rate * 100, 1)])
    return rows


def target_rows(report: ModelReport) -> list[list[str]]:
    slo = report.slos[0]
    cap = {label: report.capacity(label, slo) for label in report.bounds}
    rows = []

    def ratio(a: str, b: str) -> float | None:
        return cap[a] / cap[b] if cap.get(a) and cap.get(b) else None

    rows += fleet_target_rows(cap, ratio)
    for base, need in (("round_robin", 1.167), ("random", 1.167), ("llumnix", 1.0),
                       ("infaas", 1.0)):
        value = ratio("block", base)
        if value is not None:
            rows.append([f"block capacity >= {need:.3f} x {base}", f"{value:.3f} x",
                         "yes" if value >= need else "no"])
    for label in [lab for lab in cap if lab.startswith("block@") and lab != "block@oracle"]:
        value = ratio(label, "block@oracle")
        if value is not None:
            rows.append([f"{label} capacity vs block@oracle", f"{(value - 1) * 100:+.1f}%",
                         "(realistic case)"])
    value = ratio("block", "block@oracle")
    if value is not None:
        rows.append(["block within 3% of block@oracle", f"{(value - 1) * 100:+.1f}%",
                     "yes" if value >= 0.97 else "no"])
    if "block" in report.cdf and "round_robin" in report.cdf:
        b, rr = report.cdf["block"].e2e_p99_s, report.cdf["round_robin"].e2e_p99_s
        rows.append([f"block p99 e2e <= 0.6 x round_robin's at {fmt(report.cdf_rate)}/s",
                     f"{b / rr:.3f} x", "yes" if b <= 0.6 * rr else "no"])
    if len(report.at_block_rate) == 2:
        b = report.at_block_rate["block"].e2e_p99_s
        rr = report.at_block_rate["round_robin"].e2e_p99_s
        measured = "round_robin overloaded" if math.isinf(rr) else f"{b / rr:.3f} x"
        rows.append([f"(context) block p99 e2e vs round_robin's at {fmt(report.block_rate)}/s",
                     measured, ""])
    rows += prefix_target_rows(report, cap)
    if report.ceiling_rps:
        rows.append(["(context) fleet ceiling: N x one saturated instance",
                     f"{report.ceiling_rps:.1f} req/s", ""])
    return rows


def fleet_target_rows(cap: dict[str, float | None],
                      ratio: Callable[[str, str], float | None]) -> list[list[str]]:
    """Issue 31's targets for the fleet default policy, and its oracle variant's (the ceiling
    no placement by that policy passes)."""
    default = FLEET_DEFAULT_POLICY
    if default not in cap:
        return []
    rows = []
    for base, need in FLEET_TARGETS:
        for label in (default, f"{default}@oracle"):
            value = ratio(label, base)
            if value is not None:
                rows.append([f"{label} capacity >= {need:.2f} x {base}", f"{value:.3f} x",
                             "yes" if value >= need else "no"])
    value = ratio(default, f"{default}@oracle")
    if value is not None:
        rows.append([f"{default} >= 0.97 x {default}@oracle", f"{value:.3f} x",
                     "yes" if value >= 0.97 else "no"])
    return rows


def prefix_target_rows(report: ModelReport, cap: dict[str, float | None]) -> list[list[str]]:
    """Issue 15's prefix-caching targets: block against prefix_affinity (Mooncake)."""
    rows = []
    if cap.get("block") and cap.get("prefix_affinity"):
        value = cap["block"] / cap["prefix_affinity"]
        rows.append(["block capacity >= 1.1 x prefix_affinity", f"{value:.3f} x",
                     "yes" if value >= 1.1 else "no"])
    if "block" in report.cdf and "prefix_affinity" in report.cdf:
        b, pa = report.cdf["block"].ttft_p50_s, report.cdf["prefix_affinity"].ttft_p50_s
        measured = "prefix_affinity overloaded" if math.isinf(pa) else f"{(1 - b / pa) * 100:.1f}%"
        met = math.isinf(pa) or b <= 0.8 * pa
        rows.append([f"block TTFT p50 >= 20% below prefix_affinity's at {fmt(report.cdf_rate)}/s",
                     measured, "yes" if met else "no"])
    return rows


def print_report(report: ModelReport, args: argparse.Namespace) -> None:
    labels = list(report.bounds)
    slo_headers = [f"capacity @ TTFT p99 {s:g}s" for s in report.slos]
    print_table(f"{report.model}: capacity (req/s, {report_size(report, args)} instances, "
                f"{args.workload}, predictor {args.predictor})",
                ["config", *slo_headers, "vs round_robin", "vs random",
                 *(f"@{v}" for v in LENGTH_VARIANTS), "vs @mean", "paper"],
                capacity_rows(report, labels,
                              PAPER.get(report.model, {})
                              if args.num_instances == 12 and args.workload == "sharegpt" else {}),
                args.markdown)
    if report.cdf:
        where = (f"80 % of {FLEET_DEFAULT_POLICY}'s capacity" if args.fleet
                 else "round_robin's capacity")
        print_table(f"{report.model}: at {where}, {fmt(report.cdf_rate)} req/s "
                    f"(latencies in s)",
                    ["config", "TTFT p50", "TTFT p99", "e2e p50", "e2e p99", "req/s",
                     "preemptions", "decision us", "what-if e2e err %", "cache hit %"],
                    point_rows(report.cdf), args.markdown)
    print_table(f"{report.model}: targets (TTFT p99 SLO {report.slos[0]:g}s)",
                ["target", "measured", "met"], target_rows(report), args.markdown)
    if args.all_points:
        rows = [[label, fmt(rate), *point_rows({label: r})[0][1:]]
                for (label, rate), r in sorted(report.points.items(), key=lambda kv: kv[0])]
        print_table(f"{report.model}: every measured point",
                    ["config", "rate", "TTFT p50", "TTFT p99", "e2e p50", "e2e p99", "req/s",
                     "preemptions", "decision us", "what-if e2e err %", "cache hit %"], rows,
                    args.markdown)
    if report.wall_s:
        print(f"\n{report.model}: {len(report.points) + len(report.cdf)} runs in "
              f"{report.wall_s:.0f} s")


def report_size(report: ModelReport, args: argparse.Namespace) -> int:
    return len(parse_fleet(args.fleet)) if args.fleet else args.num_instances


def plot_report(report: ModelReport, args: argparse.Namespace) -> list[Path]:
    # NOTE: imported here so that tables need no plotting stack (--no-plots).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.plot_dir.mkdir(parents=True, exist_ok=True)
    name = report.model.replace("+", "_") + ("_equal_kv" if args.fleet and args.equal_kv else "")
    stem = f"cluster_{args.workload}_{name}{'_smoke' if args.smoke else ''}"
    paths = []
    fig, ax = plt.subplots(figsize=(8, 5))
    y_cap = args.abort_ttft or 3 * max(report.slos)  # aborted runs plot here
    colors = plot_colors(report.bounds)
    for label in report.bounds:
        points = sorted(report.p99_by_rate(label).items())
        ax.plot([r for r, _ in points], [min(p, y_cap) for _, p in points], marker="o",
                markersize=3, label=label, color=colors[label],
                linestyle="--" if "@" in label else "-")
    for slo in report.slos:
        ax.axhline(slo, color="grey", linewidth=0.8, linestyle=":")
    if report.ceiling_rps:
        ax.axvline(report.ceiling_rps, color="black", linewidth=0.8, linestyle=":")
        ax.text(report.ceiling_rps, y_cap, " fleet ceiling", fontsize=7, va="top")
    ax.set_yscale("log")
    ax.set_xlabel("arrival rate (req/s)")
    ax.set_ylabel(f"TTFT p99 (s, capped at {y_cap:g})")
    ax.set_title(f"{report.model}, {report_size(report, args)} instances, {args.workload}")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    paths.append(args.plot_dir / f"{stem}_p99_ttft.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    if report.cdf:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        for label, result in report.cdf.items():
            for ax, values in zip(axes, (result.ttft_s, result.e2e_s), strict=True):
                data = sorted(values)
                n = len(data)
                ax.plot(data, [(i + 1) / n for i in range(n)], label=label,
                        color=colors[label], linestyle="--" if "@" in label else "-")
        for ax, name in zip(axes, ("TTFT", "end-to-end latency"), strict=True):
            ax.set_xscale("log")
            ax.set_xlabel(f"{name} (s)")
            ax.set_ylabel("fraction of requests")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{report.model}, {fmt(report.cdf_rate)} req/s")
        paths.append(args.plot_dir / f"{stem}_cdf.png")
        fig.tight_layout()
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def plot_colors(labels: Sequence[str]) -> dict[str, str]:
    """A distinct colour per configuration (matplotlib's ten, then a few more)."""
    palette = [f"C{i}" for i in range(10)] + ["black", "gold", "teal", "navy"]
    return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


def dump_json(reports: Sequence[ModelReport], args: argparse.Namespace,
              workload: Workload | None = None) -> None:
    def clean(value: object) -> object:
        return None if isinstance(value, float) and not math.isfinite(value) else value

    def point(result: RunResult) -> dict:
        data = asdict(result)
        data.pop("ttft_s")
        data.pop("e2e_s")
        return {k: clean(v) for k, v in data.items()}

    out = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        # NOTE: one row per (model, config): what a live run's capacities join on.
        "summary": [{
            "source": "simulated", "workload": args.workload, "model": r.model,
            "num_instances": report_size(r, args), "num_requests": args.num_requests,
            "seed": args.seed, "slo_ttft_p99_s": args.slo[0], "config": label,
            "policy": parse_config(label).policy,
            "predictor": args.predictor if parse_config(label).predictor == "default"
            else parse_config(label).predictor,
            "capacity_rps": r.capacity(label, args.slo[0]),
            "capacity_failing_rps": r.bounds[label][args.slo[0]][1],
        } for r in reports for label in r.bounds],
        "workload": None if workload is None else {
            "name": workload.name, "num_requests": len(workload),
            "mean_prompt_tokens": sum(workload.num_prompt_tokens) / len(workload),
            "mean_output_tokens": workload.mean_output_tokens,
        },
        "models": [{
            "model": r.model,
            "capacity": {label: {f"{slo:g}": list(b) for slo, b in slos.items()}
                         for label, slos in r.bounds.items()},
            "ceiling_rps": r.ceiling_rps,
            "cdf_rate": r.cdf_rate,
            "at_cdf_rate": {label: point(res) for label, res in r.cdf.items()},
            "block_rate": r.block_rate,
            "at_block_rate": {label: point(res) for label, res in r.at_block_rate.items()},
            "points": [{"config": label, **point(res)} for (label, _), res in
                       sorted(r.points.items())],
        } for r in reports],
    }
    args.json.write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR,
                        help="shared data directory (default: ../shared/data)")
    parser.add_argument("--models", nargs="+", default=list(NUM_BLOCKS), choices=list(NUM_BLOCKS))
    parser.add_argument("--fleet", help="a fleet of unlike instances in the BLOCKQ_FLEET JSON "
                                        "format (the text, or a file holding it); replaces "
                                        "--models and --num-instances")
    parser.add_argument("--equal-kv", action="store_true",
                        help="with --fleet: every instance with the settings (KV blocks, "
                             "max_num_seqs) of the one with the fewest KV blocks")
    parser.add_argument("--workload", default="sharegpt", choices=list(WORKLOADS))
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--num-instances", type=int, default=12)
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS),
                        help="policy or policy@predictor (oracle, mean, lognormal:<sigma>)")
    parser.add_argument("--predictor", default=None,
                        help="length predictor of configs that name none (default: 'learned' "
                             f"on the conversations workload, else '{DEFAULT_PREDICTOR}': the "
                             "shipped model's measured held-out errors)")
    parser.add_argument("--replay", type=Path, default=DEFAULT_REPLAY,
                        help="requests.jsonl of scripts/make_live_workload.py (conversations)")
    parser.add_argument("--live-settings", action="store_true",
                        help=f"the live benchmark's setup: 12 x {LIVE_MODEL}, "
                             f"{', '.join(LIVE_CONFIGS)}, TTFT p99 SLO 3 s, step noise "
                             f"{LIVE_EXEC_NOISE}")
    parser.add_argument("--rates", help="rate grid LO:HI:STEP for 12 instances (scaled to "
                                        "--num-instances); default per model")
    parser.add_argument("--slo", type=float, nargs="+", default=[3.0, 10.0],
                        help="TTFT p99 SLOs in seconds; the first is the headline")
    parser.add_argument("--bisect", type=int, default=3,
                        help="halvings of the grid step when narrowing a capacity")
    parser.add_argument("--publish-interval", type=float, default=0.1,
                        help="seconds between two published instance states")
    parser.add_argument("--exec-noise", type=float, default=0.1,
                        help="sigma of the lognormal noise on ground-truth step times")
    parser.add_argument("--abort-ttft", type=float, default=20.0,
                        help="give up a run once 1%% of requests waited this long")
    parser.add_argument("--ground-truth", default="ours", choices=["ours", "vllm", "vllm-async"],
                        help="the instances' scheduler: ours (workers.sim) or the installed "
                             "vLLM's own Scheduler class, synchronous or with async "
                             "scheduling (about 10x slower)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot-dir", type=Path, default=DEFAULT_PLOT_DIR)
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--no-length-variants", action="store_true",
                        help="run each what-if policy with its configured predictor only, "
                             "not also @mean and @oracle beside it")
    parser.add_argument("--json", type=Path, help="write every measured point to this file")
    parser.add_argument("--all-points", action="store_true", help="print every measured point")
    parser.add_argument("--no-cdf", action="store_true",
                        help="capacities only: skip the runs at round robin's and block's "
                             "capacity (CDFs, end-to-end comparison)")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--mooncake-settings", action="store_true",
                        help=f"issue 15's prefix-caching comparison: the mooncake workload on "
                             f"12 x {MOONCAKE_MODEL} (max_model_len {MOONCAKE_MAX_MODEL_LEN}, "
                             f"prefix caching on), {', '.join(MOONCAKE_CONFIGS)}")
    parser.add_argument("--mooncake-max-model-len", type=int, default=MOONCAKE_MAX_MODEL_LEN,
                        help="the mooncake workload's context (longer prompts dropped): 4096 is "
                             "the live benchmark's (`bench_live.py --workloads mooncake`)")
    parser.add_argument("--smoke", action="store_true",
                        help="CI size: 4 instances, 400 requests, 5 configs, coarse search")
    parser.add_argument("--replot", type=Path, metavar="JSON",
                        help="reprint tables and redraw plots from a --json file of an earlier "
                             "run (reruns only the CDF points, with that run's settings)")
    parser.add_argument("--workload-file", type=Path,
                        help="with --fleet: replay this blockq plan workload (JSONL) under the "
                             "production default policies and print each model's latencies")
    parser.add_argument("--rate-scale", type=float, default=1.0,
                        help="with --workload-file: replay at this multiple of its rate")
    parser.add_argument("--catalog", type=Path, help="with --workload-file: the GPU catalog "
                        "an instance's gpu_kind names (default: the shipped one)")
    parser.add_argument("--model-map", nargs="+", default=[], metavar="SERVED=FAMILY",
                        help="with --workload-file: the execution-time model family of a "
                             "served model name")
    parser.add_argument("--min-requests", type=int, default=PlanOptions().min_requests_per_pool,
                        help="with --workload-file: replay each model's workload repeated to "
                             "at least this many requests (blockq plan's --min-requests)")
    args = parser.parse_args()
    if args.replot:
        replot(args)
        return
    if args.workload_file:
        replay_workload_file(args, parser)
        return
    if args.fleet:
        use_fleet(args, parser)
    if args.live_settings:
        args.models, args.num_instances, args.configs = [LIVE_MODEL], 12, list(LIVE_CONFIGS)
        args.slo, args.exec_noise = [3.0], LIVE_EXEC_NOISE
    if args.mooncake_settings:
        args.workload, args.models = "mooncake", [MOONCAKE_MODEL]
        if args.configs == list(DEFAULT_CONFIGS):
            args.configs = list(MOONCAKE_CONFIGS)
        args.rates = args.rates or MOONCAKE_RATES
    if args.smoke:
        args.num_instances, args.num_requests, args.bisect, args.slo = 4, 400, 1, args.slo[:1]
        if args.configs == list(DEFAULT_CONFIGS):
            args.configs = list(SMOKE_CONFIGS)
    if not args.no_length_variants:
        args.configs = with_length_variants(args.configs)
    workload = load_workload(args)
    args.max_model_len = workload_max_model_len(args)
    args.prefix_block_size = workload.prefix_block_size if workload.prefix_hashes else 0
    if args.predictor is None:
        args.predictor = default_predictor(workload)
    print(f"workload {workload.name}: {len(workload)} requests, mean prompt "
          f"{sum(workload.num_prompt_tokens) / len(workload):.0f} tokens, mean output "
          f"{workload.mean_output_tokens:.0f} tokens; predictor {args.predictor}", flush=True)
    reports = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for model in args.models:
            model_args = argparse.Namespace(**vars(args))
            if args.smoke and not args.rates and not args.fleet:
                low, high, _ = (float(x) for x in DEFAULT_RATES[model].split(":"))
                model_args.rates = f"{low}:{high}:{(high - low) / 3}"
            report = run_model(model, model_args, workload, pool)
            reports.append(report)
            print_report(report, args)
            if not args.no_plots:
                for plot in plot_report(report, args):
                    shown = plot.relative_to(ROOT) if plot.is_relative_to(ROOT) else plot
                    print(f"wrote {shown}")
    if args.json:
        dump_json(reports, args, workload)


def use_fleet(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Read `--fleet` (JSON text or a file), check it, and run it instead of `--models`."""
    text = args.fleet
    if not text.lstrip().startswith(("[", "{")):
        path = Path(text)
        if not path.is_file():
            parser.error(f"--fleet: {text!r} is neither a JSON list nor a file")
        text = path.read_text()
    try:
        specs = parse_fleet(text)
        members = fleet_members(specs)
    except (FleetError, ValueError) as exc:
        parser.error(f"--fleet: {exc}")
    args.fleet = text
    args.num_instances = len(members)
    args.models = [fleet_label(specs)]
    if args.configs == list(DEFAULT_CONFIGS):
        args.configs = list(FLEET_CONFIGS)


def replay_workload_file(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """`--fleet` replaying `--workload-file` (issue 41): a table, then the JSON line."""
    from domain.settings import Settings  # the production defaults of the routing policies

    if not args.fleet:
        parser.error("--workload-file needs --fleet")
    text = args.fleet
    if not text.lstrip().startswith(("[", "{")):
        text = Path(text).read_text() if Path(text).is_file() else text
    defaults = Settings.model_fields
    options = PlanOptions(single_policy=defaults["routing_policy"].default,
                          mixed_policy=defaults["mixed_fleet_routing_policy"].default,
                          seed=args.seed, publish_interval_s=args.publish_interval,
                          exec_noise_sigma=args.exec_noise, min_requests_per_pool=args.min_requests)
    try:
        family_of = dict(item.split("=", 1) for item in args.model_map)
        with args.workload_file.open() as lines:
            workload = parse_workload(lines, source=str(args.workload_file))
        catalog = load_catalog(args.catalog) if args.catalog else load_catalog()
        result = replay_fleet(parse_fleet(text), workload, catalog, options, args.rate_scale,
                              family_of)
    except (FleetError, PlanInputError, OSError, ValueError) as exc:
        parser.error(str(exc))
    table = Table(title=f"{args.workload_file.name} at x{args.rate_scale:g} its rate")
    for column in ("model", "instances", "policy", "rate req/s", "requests", "TTFT p99 s",
                   "e2e p99 s"):
        table.add_column(column)
    for model, figures in result["models"].items():
        table.add_row(model, str(figures["instances"]), figures["policy"],
                      f"{figures['rate_rps']:g}", str(figures["requests"]),
                      str(figures["ttft_p99_s"]), str(figures["e2e_p99_s"]))
    Console().print(table)
    print(json.dumps(result), flush=True)


def default_predictor(workload: Workload) -> str:
    """The learned model's own predictions where the workload has them, else its errors."""
    return "learned" if workload.predicted_output_tokens is not None else DEFAULT_PREDICTOR


def workload_max_model_len(args: argparse.Namespace) -> int:
    if args.workload == "mooncake":
        return getattr(args, "mooncake_max_model_len", MOONCAKE_MAX_MODEL_LEN)
    return DEFAULT_MAX_MODEL_LEN


def load_workload(args: argparse.Namespace) -> Workload:
    if args.workload in ("system-prompts", "chats"):
        lengths = load_length_trace(args.data / SHAREGPT, max_model_len=DEFAULT_MAX_MODEL_LEN,
                                    num_requests=args.num_requests, seed=args.seed)
        if args.workload == "system-prompts":
            return shared_prompt_workload(lengths, num_prompts=16, prompt_tokens=1024,
                                          block_tokens=SYNTHETIC_PREFIX_TOKENS,
                                          max_model_len=DEFAULT_MAX_MODEL_LEN, seed=args.seed)
        return multi_turn_workload(lengths, mean_turns=4.0, mean_gap_requests=60.0,
                                   block_tokens=SYNTHETIC_PREFIX_TOKENS,
                                   max_model_len=DEFAULT_MAX_MODEL_LEN, seed=args.seed)
    if args.workload == "mooncake":
        return load_mooncake_trace(args.data / MOONCAKE_CONV,
                                   max_model_len=workload_max_model_len(args),
                                   num_requests=args.num_requests)
    if args.workload == "conversations":
        return replay_workload(load_replay_prompts(args.replay), num_requests=args.num_requests,
                               max_model_len=4096, seed=args.seed)
    path = args.data / WORKLOADS[args.workload]
    if args.workload == "sharegpt-azure":
        return load_sharegpt_azure(path, args.data / AZURE_CONV, max_model_len=4096,
                                   num_requests=args.num_requests)
    if args.workload == "sharegpt":
        return load_length_trace(path, max_model_len=4096, num_requests=args.num_requests,
                                 seed=args.seed)
    return load_azure_trace(path, max_model_len=4096, num_requests=args.num_requests)


def replot(cli: argparse.Namespace) -> None:
    args, reports = load_reports(cli.replot)
    args.plot_dir, args.markdown, args.all_points = cli.plot_dir, cli.markdown, cli.all_points
    args.jobs, args.data = cli.jobs, cli.data
    workload = load_workload(args)
    args.fleet, args.equal_kv = getattr(args, "fleet", None), getattr(args, "equal_kv", False)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for report in reports:
            run_cdf(report, args, workload, setup_of(report.model, args, workload), pool)
            print_report(report, args)
            for plot in plot_report(report, args):
                shown = plot.relative_to(ROOT) if plot.is_relative_to(ROOT) else plot
                print(f"wrote {shown}")
