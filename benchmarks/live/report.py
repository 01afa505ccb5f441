"""Tables (rich) and plots (matplotlib) of the live benchmark's raw results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.tables import fmt

__all__ = ["fmt", "print_report", "plot", "versus_simulated_points"]


def _capacity(points: list[dict[str, Any]], slo: float) -> tuple[float | None, float | None]:
    """Highest rate tried whose TTFT p99 met the SLO, lowest whose did not."""
    ok = [p["rate"] for p in points if p["ttft_s"]["p99"] <= slo]
    bad = [p["rate"] for p in points if p["ttft_s"]["p99"] > slo]
    passing = max((r for r in ok if not bad or r < min(bad)), default=None)
    return passing, min(bad, default=None)


def _cores(point: dict[str, Any]) -> tuple[float, float]:
    """Cores the control plane and the engines used over the point's window."""
    control = sum(v for k, v in point["cpu_s"].items() if not k.startswith("gpu."))
    engines = sum(v for k, v in point["cpu_s"].items() if k.startswith("gpu."))
    window = point["wall"]["window_s"]
    return control / window, engines / window


def print_report(raw: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    slo = raw["slo_s"]
    for workload in raw["workloads"]:
        points = [p for p in raw["points"] if p["workload"] == workload]
        if not points:
            continue
        scale = points[0]["time_scale"]
        table = Table(title=f"Live, {workload}: {_fleet_of(raw, points[0]['instances'])}, "
                            f"time scale {scale:g} (latencies in "
                            f"emulated s; accept->routed also wall ms)")
        for column in ("policy", "rate/s", "TTFT p50", "TTFT p99", "e2e p50", "e2e p99",
                       "accept->routed p50/p99 ms", "done", "len err", "fallbk", "load 1m",
                       "CPU cores ctl/eng", "ctl CPU ms/req above idle"):
            table.add_column(column, justify="right")
        for p in sorted(points, key=lambda p: (raw["policies"].index(p["policy"]), p["rate"])):
            wall = p["accept_to_routed_wall_ms"]
            err = p["prediction_median_rel_error"]
            table.add_row(
                p["policy"], f"{p['rate']:g}", fmt(p["ttft_s"]["p50"]),
                f"> {slo:g} (stopped)" if p.get("stopped_early") else fmt(p["ttft_s"]["p99"]),
                fmt(p["e2e_s"]["p50"], 1), fmt(p["e2e_s"]["p99"], 1),
                f"{fmt(wall['p50'], 0)}/{fmt(wall['p99'], 0)}",
                f"{p['finished']}/{p['requests']}", fmt(err), str(p["fallback_routed"]),
                f"{p['load']['loadavg_1m_mean']:.1f}/{p['load']['cpus']}",
                "/".join(fmt(v) for v in _cores(p)),
                fmt(p.get("cpu_ms_per_request_above_idle", p["cpu_ms_per_request"])
                   ["control_plane"], 1))
        console.print(table)
        pools = _by_model_table(raw, points)
        if pools is not None:
            console.print(pools)
        cap = Table(title=f"Capacity at TTFT p99 <= {slo:g} s (emulated), {workload}")
        for column in ("policy", "capacity req/s", "first failing", "x round_robin"):
            cap.add_column(column, justify="right")
        capacities = {policy: _capacity([p for p in points if p["policy"] == policy], slo)
                      for policy in raw["policies"] if any(p["policy"] == policy for p in points)}
        base = capacities.get("round_robin", (None, None))[0]
        for policy, (capacity, failing) in capacities.items():
            ratio = capacity / base if capacity and base else None
            cap.add_row(policy, fmt(capacity, 1) if capacity else "< lowest tried",
                        fmt(failing, 1) if failing else "none failed", fmt(ratio))
        console.print(cap)
        if raw.get("simulated"):
            console.print(_versus_simulated(raw, workload, capacities))
        for note in points[0]["notes"]:
            console.print(f"  note: {note}")
        trouble = [p for p in points if p["table_misses"] or p["failed"] or p["rerouted"]
                   or p["http_errors"]]
        for p in trouble:
            console.print(f"  [yellow]{p['policy']} @ {p['rate']:g}: table misses "
                          f"{p['table_misses']}, failed {p['failed']}, rerouted {p['rerouted']}, "
                          f"HTTP errors {p['http_errors']}[/yellow]")


def _by_model_table(raw: dict[str, Any], points: list[dict[str, Any]]) -> Table | None:
    """Each model's pool at each point (a fleet of several models), or None."""
    pooled = [p for p in points if p.get("by_model")]
    if not pooled:
        return None
    table = Table(title="Per model's pool (emulated s)")
    for column in ("policy", "rate/s", "model", "requests", "TTFT p50", "TTFT p99", "e2e p50",
                   "e2e p99"):
        table.add_column(column, justify="right")
    for p in sorted(pooled, key=lambda p: (raw["policies"].index(p["policy"]), p["rate"])):
        for model, pool in p["by_model"].items():
            table.add_row(p["policy"], f"{p['rate']:g}", model, str(pool["requests"]),
                          fmt(pool["ttft_s"]["p50"], 3), fmt(pool["ttft_s"]["p99"], 3),
                          fmt(pool["e2e_s"]["p50"]), fmt(pool["e2e_s"]["p99"]))
    return table


def _simulated_model(raw: dict[str, Any]) -> str:
    """The `model` of the discrete-event benchmark's summary rows for this run's fleet."""
    return raw.get("fleet_label") or raw.get("exec_model", "qwen2-7b-a30")


def _fleet_of(raw: dict[str, Any], instances: int) -> str:
    if raw.get("fleet_label"):
        return f"emulated fleet {raw['fleet_label']}"
    return f"{instances} emulated {raw.get('exec_model', 'qwen2-7b-a30')} instances"


def _versus_simulated(raw: dict[str, Any], workload: str,
                      capacities: dict[str, tuple[float | None, float | None]]) -> Table:
    """Live capacity beside the discrete-event benchmark's for the same setup."""
    table = Table(title=f"Live vs simulated capacity (req/s), {workload}, "
                        f"{raw['requests']} requests, seed {raw['seed']}")
    for column in ("policy", "live", "live first failing", "simulated", "live / simulated"):
        table.add_column(column, justify="right")
    for policy, (capacity, failing) in capacities.items():
        sim = next((row.get("capacity_rps") for row in raw["simulated"]
                    if (row.get("workload"), row.get("config"), row.get("num_requests"),
                        row.get("seed")) == (workload, policy, raw["requests"], raw["seed"])
                    and row.get("model") == _simulated_model(raw)),
                   None)
        ratio = capacity / sim if capacity and sim else None
        table.add_row(policy, fmt(capacity, 1) if capacity else "< lowest tried",
                      fmt(failing, 1) if failing else "none failed",
                      fmt(sim, 1) if sim else "-", fmt(ratio))
    return table


def versus_simulated_points(raw: dict[str, Any], simulated: dict[str, Any]) -> Table:
    """Each live point beside the discrete-event benchmark's point of the same policy and rate
    (`bench_cluster.py --json`: its `models[].points`, for this run's fleet), and their ratio:
    the "live within 10 % of the simulation at the same points" check."""
    model = _simulated_model(raw)
    by_point = {(p["config"], float(p["rate"])): p for m in simulated["models"]
                if m["model"] == model for p in m["points"]}
    table = Table(title=f"Live beside simulated at the same points ({model}, "
                        f"{raw['requests']} requests, seed {raw['seed']}; emulated s)")
    for column in ("policy", "rate/s", "where", "TTFT p50", "TTFT p99", "e2e p50", "e2e p99"):
        table.add_column(column, justify="right")
    keys = (("p50", "ttft_p50_s"), ("p99", "ttft_p99_s"))
    for p in sorted(raw["points"], key=lambda p: (raw["policies"].index(p["policy"]), p["rate"])):
        sim = by_point.get((p["policy"], float(p["rate"])))
        live = [p["ttft_s"][k] for k, _ in keys] + [p["e2e_s"][k] for k, _ in keys]
        stopped = p.get("stopped_early")
        table.add_row(p["policy"], f"{p['rate']:g}", "live",
                      *(("-",) * 4 if stopped else tuple(fmt(v, 3) for v in live)))
        if sim is None:
            continue
        simulated_row = [sim[s] for _, s in keys] + [sim["e2e_p50_s"], sim["e2e_p99_s"]]
        table.add_row("", "", "simulated", *(fmt(v, 3) for v in simulated_row))
        if not stopped:
            table.add_row("", "", "live / simulated", *(
                fmt(a / b if a is not None and b else None, 3)
                for a, b in zip(live, simulated_row, strict=True)))
    return table


def plot(raw: dict[str, Any], out_dir: Path, prefix: str = "live") -> list[Path]:
    """TTFT p99 against the rate, one line per policy, per workload."""
    import matplotlib  # noqa: PLC0415 - only when plotting

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for workload in raw["workloads"]:
        points = [p for p in raw["points"] if p["workload"] == workload]
        if not points:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for policy in raw["policies"]:
            mine = sorted((p["rate"], p["ttft_s"]["p99"]) for p in points
                          if p["policy"] == policy)
            if mine:
                ax.plot([r for r, _ in mine], [min(v, 4 * raw["slo_s"]) for _, v in mine],
                        marker="o", label=policy)
        ax.axhline(raw["slo_s"], color="grey", linestyle="--", label=f"SLO {raw['slo_s']:g} s")
        ax.set_xlabel("arrival rate (requests per emulated second)")
        ax.set_ylabel("TTFT p99 (emulated s; capped at 4x SLO)")
        ax.set_title(f"Live stack, {workload}, {_fleet_of(raw, points[0]['instances'])} "
                     f"(time scale {points[0]['time_scale']:g})"
                     + (" [SMOKE]" if raw.get("smoke") else ""), fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        path = out_dir / f"{prefix}_{workload}_p99_ttft.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
