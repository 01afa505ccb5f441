"""The one settings object: every knob of blockq, read from the environment and an optional file.

Environment variables are ``BLOCKQ_<FIELD>`` (for example ``BLOCKQ_API_PORT``), except the two
connection URLs, which take their conventional names ``DATABASE_URL`` and ``REDIS_URL``. A file in
``.env`` format named by ``BLOCKQ_CONFIG_FILE`` is read too; the environment wins over the file.
Nothing else in blockq reads the environment.
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AliasChoices,
    Field,
    IPvAnyNetwork,
    PositiveInt,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from workers.autoscale.catalog import CatalogError, missing_kinds, parse_prices
from workers.sim.fleet_declaration import FleetSlot, InstanceSpec, fleet_slots, parse_fleet_entries

__all__ = ["Settings", "EngineKind", "describe_invalid"]

EngineKind = Literal["vllm", "emulated"]

_ENV_NAMES = {"database_url": "DATABASE_URL", "redis_url": "REDIS_URL",
              "prometheus_multiproc_dir": "PROMETHEUS_MULTIPROC_DIR"}
#: Settings whose being unset means something, passed on to child processes only when set:
#: an unset routing_policy lets a pool of unlike instances take mixed_fleet_routing_policy.
_PASSED_ONLY_WHEN_SET = frozenset({"routing_policy"})


class Settings(BaseSettings):
    """Configuration shared by the API, the Celery workers and the CLI. Read-only once built."""

    model_config = SettingsConfigDict(env_prefix="BLOCKQ_", frozen=True, extra="ignore")

    # --- where things live -------------------------------------------------------------------
    data_dir: Path = Field(
        Path(".blockq"),
        description="Directory for local state: the embedded SQLite database, the tiny model, "
        "process logs and the generated webhook secret. Relative paths are taken from the "
        "working directory.",
    )
    database_url: str | None = Field(
        None,
        validation_alias=AliasChoices("DATABASE_URL", "BLOCKQ_DATABASE_URL"),
        description="SQLAlchemy URL of the database, e.g. postgresql+psycopg://user@host/db. "
        "Unset: an SQLite file in data_dir (embedded mode, one host only).",
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("REDIS_URL", "BLOCKQ_REDIS_URL"),
        description="Redis URL: the Celery broker (unless broker_url is set) and the store of "
        "instance states, heartbeats and routing assignments.",
    )
    broker_url: str | None = Field(
        None, description="The Celery broker when it is not redis_url: `amqp://user:password@"
        "host:5672/vhost` for RabbitMQ, with quorum queues (docs/multihost.md says when to "
        "choose it). Unset: redis_url.",
    )

    # --- the model served ----------------------------------------------------------------------
    model_path: Path | None = Field(
        None,
        description="Local Hugging Face model directory served by the engines. Unset: the tiny "
        "test model that `scripts/build_tiny_model.py` builds in data_dir/models/tiny-llama.",
    )
    model_name: str = Field("tiny-llama", description="Name under which the model is served "
                            "(with fleet set: the model of a native request that names none is "
                            "the first entry's).")
    fleet: Annotated[tuple[InstanceSpec, ...], NoDecode] = Field(
        (), description="The local stack's engine instances as a JSON list of objects: `model` "
        "(required), `count` (default 1), `model_path` (default: model_path for model_name, "
        "else data_dir/models/<model>), `engine` (\"vllm\" or \"emulated\"; default "
        "engine_kind) and `exec_model` (an emulated instance's hardware, a bundled "
        "execution-time model such as llama-2-7b-a100, or a model file's path with num_blocks "
        "and max_num_seqs, as `blockq plan --fleet-out` writes a derived GPU kind's; default "
        "emulated_exec_model), e.g. "
        "'[{\"model\": \"tiny-llama\", \"count\": 2}, {\"model\": \"tiny-qwen\"}]'. Instance k "
        "(in this order, counts expanded) consumes queue gpu.<k>. Unset: num_instances "
        "instances of model_name. An autoscaled entry also takes `min_count`, `max_count` "
        "(count is then the starting size, 0 allowed), `gpu_kind` (its name in the GPU "
        "catalog) and, emulated, `start_s` (its cold start); its max_count slots keep their "
        "ids gpu.<k> whether they run or not (docs/autoscaling.md).",
    )
    max_model_len: int = Field(2048, gt=0, description="Context length: prompt + output tokens.")

    # --- API -----------------------------------------------------------------------------------
    api_host: str = Field("127.0.0.1", description="Address the API binds to.")
    api_port: int = Field(8000, gt=0, lt=65536, description="Port the API listens on.")
    api_workers: int = Field(2, gt=0, description="Gunicorn worker processes for the API.")
    api_connections: int = Field(
        4096, gt=0, description="Connections each API worker serves at once (gunicorn's gevent "
        "worker_connections): an open stream or a waiting (non-streamed) OpenAI completion holds "
        "one connection and no thread, so one worker holds thousands.",
    )
    api_keepalive_s: int = Field(
        75, gt=0, description="Seconds the API keeps an idle HTTP/1.1 connection open for the "
        "client's next request (gunicorn's keep-alive). Keep it above the idle timeout of every "
        "client and proxy in front (httpx 5 s, load balancers often 60 s): a server that closes "
        "first races the client's next request on that connection, which then fails unsent.",
    )
    sync_timeout_s: float = Field(
        600.0, gt=0, description="Longest an OpenAI-compatible completion waits for its "
        "request to finish (504 after; the request goes on).",
    )
    api_body_read_timeout_s: float = Field(
        30.0, gt=0, description="Longest the API waits for a request's whole body once it has "
        "started reading it (gunicorn): a client that sends less than its Content-Length gets "
        "408 and the connection is closed, instead of holding it forever.",
    )
    api_reserved_connections: int = Field(
        64, gt=0, description="Connections of each API worker that sync and streamed OpenAI "
        "completions never take, so that /healthz, /readyz and short calls are always served: "
        "a worker holds at most api_connections - api_reserved_connections such completions "
        "(more get 503). Must be below api_connections.",
    )
    api_redis_connections: int = Field(
        32, gt=0, description="Redis connections each API worker shares between all its calls "
        "(a call waits for a free one): thousands of held connections must not each open one. "
        "The stream hub, which every held completion waits on, has one more of its own.",
    )
    held_connections_per_team: int = Field(
        32, gt=0, description="Sync and streamed OpenAI completions one team may have open at "
        "once, over all API processes (counted in Redis); more get 429.",
    )
    held_connections_team_caps: dict[str, PositiveInt] = Field(
        default_factory=dict, description="Per-team exceptions to held_connections_per_team, "
        "by team name, as JSON: '{\"bench\": 200}'.",
    )
    sse_keepalive_s: float | None = Field(
        None, gt=0, description="Unset (the default), a stream sends nothing until its first "
        "event, as vLLM's own server does. Set, a stream that has sent nothing for this long "
        "sends an SSE comment (': keep-alive'), for a proxy that cuts quiet connections sooner "
        "than the first token comes. Off by default: vLLM's benchmark client loses every event "
        "after a comment that reaches it in a read of its own (at 256 concurrent streams, each "
        "stream whose first token took longer than the period failed there). A client that "
        "left is noticed on its socket either way.",
    )
    max_request_bytes: int = Field(
        1 << 20, gt=0, description="Largest accepted request body; larger ones get HTTP 413."
    )
    default_max_tokens: int = Field(
        256, gt=0, description="max_tokens of a request that does not give one."
    )

    # --- engines -------------------------------------------------------------------------------
    engine_kind: EngineKind = Field("vllm", description="Engine hosted by engine workers.")
    num_instances: int = Field(
        2, gt=0, description="Engine workers the local stack (`blockq demo|serve`) starts."
    )
    max_num_seqs: int = Field(48, gt=0, description="vLLM max_num_seqs per instance.")
    instance_capacity_rps: float | None = Field(
        None, gt=0, description="Requests per second an engine instance completes saturated, "
        "as the operator measured it: published with its state, the weight capacity_weighted "
        "routing divides its backlog by (a fleet entry's capacity_rps sets it per instance).")
    max_num_batched_tokens: int = Field(512, gt=0, description="vLLM per-step token budget.")
    engine_scheduling_policy: Literal["fcfs", "priority"] = Field(
        "fcfs",
        description="Order inside each engine: fcfs (by class, interactive before batch, then "
        "arrival), or priority: predicted-shortest-first with aging (vLLM's priority policy, "
        "each request's priority its class, then arrival ms + engine_priority_ms_per_token x "
        "its predicted output tokens). Published with the engine's state: what-ifs model it.",
    )
    engine_priority_ms_per_token: float = Field(
        2.0,
        ge=0,
        description="Under engine_scheduling_policy=priority: a request predicted one token "
        "longer is served as if it had arrived this many ms later.",
    )
    engine_prefix_caching: bool = Field(
        True,
        description="Automatic prefix caching in every engine (vLLM's own default): a prompt "
        "whose leading tokens another request computed reuses their KV blocks. Engines publish "
        "the prompt units they hold and routers credit a new request's match (prefix_affinity "
        "policy, and the what-ifs).",
    )
    engine_interactive_seats: int = Field(
        0,
        ge=0,
        description="Seats of max_num_seqs (below it) each engine keeps for interactive "
        "requests: a batch request waits in the engine while max_num_seqs - this many requests "
        "run or wait in it, so an interactive arrival finds a seat instead of waiting for a "
        "batch answer to end (vLLM preempts for KV blocks only, never for a seat); and an "
        "interactive request that still finds every seat taken (a burst beyond the reserve) "
        "takes the seat of the running batch request with the largest priority, which is "
        "preempted and recomputed later (vLLM runs our scheduler subclass, "
        "workers.serve.vllm_scheduler, with async scheduling off). Published with the "
        "engine's state: what-ifs model it. 0: off.",
    )
    engine_batch_prefill_last: bool = Field(
        False,
        description="Each engine step schedules running batch requests that are prefilling "
        "after every other running request, and leaves them out of the step (seats and KV "
        "kept) while an interactive request waits, never two steps in a row: vLLM schedules "
        "running requests before waiting ones, so a batch line's long prompt otherwise takes "
        "the token budget ahead of an interactive arrival. vLLM runs our scheduler subclass "
        "(workers.serve.vllm_scheduler) with async scheduling off. Published with the "
        "engine's state: what-ifs model it.",
    )
    block_size: int | None = Field(
        None,
        gt=0,
        description="KV-cache block size in tokens. Unset: vLLM's platform default (16 on GPUs, "
        "128 on CPUs; vLLM's CPU backend takes only multiples of 32).",
    )
    kv_cache_gib: float = Field(1.0, gt=0, description="KV-cache size per CPU engine in GiB.")
    engine_threads: int = Field(1, gt=0, description="Torch threads per CPU engine.")
    engine_concurrency: int = Field(
        384,
        gt=0,
        description="Requests one engine worker holds at once (Celery thread pool size): at "
        "least max_batch_in_flight + max_num_seqs. Every request on an instance holds a thread "
        "until it ends, and the batch may put all its lines on one instance: with fewer "
        "threads, batch lines waiting in the engine take every one, and an interactive request "
        "waits in the broker, where neither its priority nor the engine's interactive seats "
        "reach it.",
    )
    state_publish_interval_s: float = Field(
        0.1, gt=0, description="How often an engine worker publishes its state to Redis."
    )
    stream_flush_interval_s: float = Field(
        0.05, gt=0, le=1.0, description="How often an engine worker writes the new text of its "
        "streamed requests to their output streams (one Redis pipeline for all of them); a "
        "request's first text is written at once, so this sets the cadence of a stream's "
        "chunks, not its time to first token. Every write is read and relayed by the API: a "
        "shorter interval sends smaller chunks, more often, at more CPU per request.",
    )
    heartbeat_ttl_s: float = Field(
        3.0,
        gt=0,
        description="An instance whose last heartbeat is older than this is dead: no new "
        "requests are routed to it and its unfinished requests are routed elsewhere.",
    )
    step_sample_flush_s: float = Field(
        1.0, gt=0, description="How often engine workers write buffered step samples."
    )

    # --- the emulated engine (engine_kind "emulated": no GPU, a simulated vLLM instance) -------
    emulated_exec_model: str = Field(
        "qwen2-7b-a30",
        description="Ground-truth execution-time model of the emulated GPU: a model bundled in "
        "workers/sim/models (qwen2-7b-a30, llama-2-7b-a30) or a model file's path.",
    )
    emulated_time_scale: float = Field(
        1.0,
        gt=0,
        description="Wall seconds per emulated second: 1.0 runs in real time, 0.1 ten times "
        "faster (every latency the emulated engine produces shrinks by the same factor).",
    )
    emulated_start_s: float = Field(
        0.0, ge=0, description="Cold start of an emulated instance: emulated seconds (times "
        "emulated_time_scale) from its start to ready, as a real engine loads its model; a "
        "fleet entry's start_s sets it per instance.",
    )
    emulated_noise: float = Field(
        0.05,
        ge=0,
        description="Sigma of the multiplicative log-normal noise (mean 1) on each emulated "
        "step's duration; 0 makes steps take exactly what the execution-time model says.",
    )
    emulated_num_blocks: int = Field(
        7289,
        gt=0,
        description="KV-cache blocks of an emulated instance (vLLM's num_gpu_blocks; 7289 is "
        "Qwen2-7B on an A30). Its block size is block_size, or 16 when that is unset.",
    )
    emulated_output_lengths: Literal["sharegpt", "max_tokens", "answers"] = Field(
        "sharegpt",
        description="True output length of an emulated request: 'sharegpt' draws it from "
        "ShareGPT's answer lengths (a fixed function of the request id), capped by max_tokens; "
        "'max_tokens' always generates max_tokens; 'answers' takes the length of a real answer "
        "to the same prompt from emulated_answers_path (ShareGPT draw for unknown prompts).",
    )
    emulated_answers_path: Path | None = Field(
        None,
        description="JSONL of real answers' lengths (`prompt`, `output_tokens` per line) for "
        "emulated_output_lengths 'answers'.",
    )

    # --- length prediction ---------------------------------------------------------------------
    length_predictor: Literal["learned", "baseline", "table"] = Field(
        "learned",
        description="Output-length predictor: 'learned' (a learned head by path: the fast "
        "static head on the hot path, the accurate MiniLM head for bulk work; workers/predict), "
        "'baseline' (the running mean of observed lengths) or 'table' (fixed "
        "predictions per prompt from length_predictions_path, e.g. a benchmark's oracle).",
    )
    length_predictions_path: Path | None = Field(
        None,
        description="JSONL of fixed length predictions (`prompt`, `predicted_tokens` per line) "
        "for length_predictor 'table'. A prompt missing from it is predicted as the table's "
        "mean, recorded with predictor 'table.missing'.",
    )
    length_model_path: Path | None = Field(
        None,
        description="Artifact of the accurate length head, which batch lines, the bulk "
        "predictor and learning use (batched). Unset: the MiniLM head shipped in "
        "workers/predict/models.",
    )
    length_fast_model_path: Path | None = Field(
        None,
        description="Artifact of the fast length head, which the hot path uses (held "
        "completions routed in the API, interactive requests in the predict task). Unset: the "
        "static sibling of length_model_path (`<stem>_static.npz`, as `blockq models "
        "length-train` writes them) where it exists, else the static head shipped in "
        "workers/predict/models.",
    )

    # --- teams ---------------------------------------------------------------------------------
    rate_limit_rpm: int = Field(
        6000, gt=0, description="Requests per minute a team may make over all endpoints, unless "
        "the team has its own limit (`blockq teams create --rate-limit`).",
    )

    # --- online learning (workers/learn) ------------------------------------------------------
    learn_retrain_interval_s: float = Field(
        3600.0, ge=0, description="How often beat retrains the length model from the request "
        "history (0: never on a schedule; `blockq models retrain` still works).",
    )
    learn_refit_interval_s: float = Field(
        600.0, ge=0, description="How often beat refits each instance's execution-time model "
        "from its step samples (0: never on a schedule).",
    )
    learn_min_rows: int = Field(
        50, ge=2, description="History rows (or step samples) needed before a retrain (refit).",
    )
    learn_max_rows: int = Field(
        20_000, ge=10, description="Newest history rows (step samples) a retrain (refit) uses.",
    )
    learn_holdout_share: float = Field(
        0.2, gt=0, lt=1, description="Newest share of the history held out to compare the "
        "candidate with the active version; the candidate is promoted only if it is better.",
    )
    length_bootstrap_rows: Path | None = Field(
        None, description="JSONL of (prompt, model, output_tokens) rows added to every retrain "
        "(e.g. exported by scripts/train_length_model.py --export-rows). Unset: history only.",
    )
    model_reload_interval_s: float = Field(
        5.0, gt=0, description="How often workers check the registry for a promoted or rolled "
        "back model (hot reload, no restart).",
    )
    bias_window: int = Field(
        10, ge=1, description="Routing falls back to round_robin when this many consecutive "
        "finished requests had length predictions more than bias_threshold off.",
    )
    bias_threshold: float = Field(
        0.5, gt=0, description="Relative length error counted as a miss by the bias watch "
        "(the learned model's median error is about 0.3 in distribution: a lower threshold "
        "keeps routing in fallback; see docs/benchmarks_length.md).",
    )
    bias_fallback_s: float = Field(
        60.0, gt=0, description="How long the round_robin fallback lasts.",
    )
    bias_correction_rate: float = Field(
        0.005, ge=0, le=1, description="Step of the length correction factor towards "
        "actual/predicted per finished request (0: no correction). Keep it small: errors "
        "arrive as many requests later as are in flight, and a large step then overshoots.",
    )

    # --- routing -------------------------------------------------------------------------------
    routing_policy: str = Field(
        "round_robin",
        description="Routing policy by name: round_robin, random, least_requests, infaas, "
        "llumnix, least_tokens, block, block_ttft, or po2_<name> / po4_<name> (power-of-k "
        "probing) for a scoring policy.",
    )
    mixed_fleet_routing_policy: str = Field(
        "block_slo",
        description="Routing policy of a model whose live instances run on unlike hardware "
        "(their published hardware or execution-time models differ), unless "
        "BLOCKQ_ROUTING_POLICY is set. block_slo (the what-if's time to first token, the "
        "preemptions it runs into charged): on 4 x A100 + 8 x A30 (simulated, 10,000 requests) "
        "1.18x llumnix's capacity at TTFT p99 3 s, level with capacity_weighted at the fleet's "
        "ceiling with better tails below it; on 2 x H100 + 10 x A30 ahead of it, 64 to 61; and "
        "the best tail where the fast GPUs have no more KV cache than the slow ones, where "
        "block collapses (docs/benchmarks_cluster.md).",
    )
    routing_exec_model: str | None = Field(
        None,
        description="Execution-time model the block policies simulate instances with: a model "
        "bundled in workers/sim/models (e.g. qwen2-7b-a30) or a path to a fitted model JSON. "
        "Unset: emulated_exec_model for emulated engines, qwen2-7b-a30 otherwise.",
    )
    routing_future_window_s: float = Field(
        0.0, ge=0, description="The block policies' what-ifs add the load expected to arrive "
        "during the new request (each instance's arrival rate and mean prompt and predicted "
        "length over the requests routed to it in this many seconds); 0: off, the what-if sees "
        "only the published state and the requests routed since (docs/benchmarks_sim.md).",
    )
    route_retry_s: float = Field(
        0.5, gt=0, description="Delay before routing is tried again when no instance is alive."
    )
    routing_hold: bool = Field(
        False, description="Late binding: the router holds a request while no instance would "
        "start it soon (a policy that simulates: the what-if's wait until first scheduled over "
        "routing_hold_max_queueing_s; others: no seat or KV blocks for the prompt), and releases "
        "held requests, oldest first, as instances publish room. Cuts the TTFT tail past the "
        "fleet's capacity; does not raise the capacity (docs/benchmarks_cluster.md).",
    )
    routing_hold_max_queueing_s: float = Field(
        0.1, ge=0, description="Late binding: an instance would start a request when its "
        "simulated wait until first scheduled is at most this (s).",
    )
    routing_hold_overtake_s: float = Field(
        1.0, ge=0, description="Late binding: later requests may pass a held one (each to an "
        "instance that would start it) until it has been held this long (s); 0: strict order.",
    )
    routing_hold_max_s: float = Field(
        30.0, gt=0, description="Late binding: a request held this long is routed to the "
        "policy's pick whether or not that instance would start it.",
    )
    slo_refuse_margin: float = Field(
        0.0, ge=0, description="A team that refuses requests whose latency targets no instance "
        "can meet (slo_miss_action refuse) refuses only those missing by more than this share "
        "of the target (e.g. 0.25: predicted over 1.25 x the target); nearer misses are routed "
        "to the closest instance (the what-if has its own error).",
    )
    session_affinity_ttl_s: float = Field(
        600.0, ge=0, description="Session affinity: how long the router remembers the instance "
        "that served a session's last turn (x-session-id, or OpenAI's user); 0: off.",
    )
    session_affinity_margin: float = Field(
        0.2, ge=0, description="Session affinity: a session's next turn goes to the instance "
        "of its previous turn when that instance's what-if end-to-end latency is within this "
        "share of the chosen instance's (0.2: at most 20 % slower) and meets the request's "
        "latency targets; policies that do not simulate ignore sessions.",
    )
    route_in_predict: bool = Field(
        True, description="The predict task routes the request it has just predicted (one "
        "transaction writes the prediction and the decision; no hop through the route queue). "
        "The route worker still routes what comes back to routing (retries, re-routes).",
    )
    route_in_api: bool = Field(
        True, description="The API predicts and routes each held OpenAI completion (streamed "
        "or not) itself, in the process that accepted it: no hop through the predict queue "
        "(workers/predict/inline.py); what it cannot route (no instance up, an error, a "
        "saturated API process) the predict task takes over. Each API process loads the "
        "length model. Off: every request goes through the predict queue. Off with "
        "late binding (routing_hold), whose holds the route worker releases; the native "
        "/v1/requests and batches always go through the predict queue.",
    )

    # --- reliability ---------------------------------------------------------------------------
    orphan_check_interval_s: float = Field(
        2.0, gt=0, description="How often the beat scheduler looks for stranded requests."
    )
    stale_queued_after_s: float = Field(
        120.0,
        gt=0,
        description="A batch still validating, finalizing or cancelling this long is sent to "
        "its batch task again.",
    )
    stranded_after_s: float = Field(
        5.0,
        gt=0,
        description="A request in flight unchanged this long is checked by the sweep: found "
        "twice with no message in the broker or the outbox and no engine holding it, it is "
        "sent on again (or re-routed, if an engine had admitted it).",
    )
    instance_expiry_s: float = Field(
        600.0, gt=0, description="An instance without a heartbeat this long (an earlier fleet's, "
        "or one stopped for good) is forgotten by the sweep: it leaves /v1/instances, and its "
        "model counts as served only while a live instance or the fleet setting serves it (a "
        "404 `model_not_found` otherwise). One that comes back registers again.",
    )
    unserved_model_timeout_s: float = Field(
        300.0, gt=0, description="A request accepted for a model that no instance serves "
        "any more (none live or recently dead, none declared by the fleet setting) fails this "
        "long after it was accepted, with error code `model_not_served`.",
    )
    unacked_fresh_s: float = Field(
        30.0,
        gt=0,
        description="A message a worker took from the broker this recently counts as worked "
        "on; an older unacknowledged one is presumed to have died with its worker.",
    )
    outbox_relay_interval_s: float = Field(
        2.0, gt=0, description="How often the health worker sends what the outbox still holds "
        "(only entries older than outbox_relay_after_s: their senders crashed or met a broker "
        "outage, so a shorter period buys little and costs an idle stack CPU).",
    )
    outbox_relay_after_s: float = Field(
        2.0,
        ge=0,
        description="The relay sends outbox entries older than this (younger ones are being "
        "sent by the process that committed them).",
    )
    ownership_check_interval_s: float = Field(
        1.0,
        gt=0,
        description="How often an engine worker checks in the database that the requests it "
        "runs are still its own (not cancelled, not re-routed), and aborts those that are not.",
    )
    broker_visibility_timeout_s: int = Field(
        3600,
        gt=0,
        description="Redis broker: seconds before an unacknowledged message is redelivered.",
    )

    # --- webhooks ------------------------------------------------------------------------------
    flower_host: str = Field(
        "127.0.0.1", description="Address Flower binds to: a loopback address only (its "
        "/metrics and /healthcheck answer without credentials); reach it by an SSH tunnel.",
    )
    flower_port: int = Field(
        5555, gt=0, lt=65536, description="Port of Flower, which `blockq serve` starts on "
        "flower_host.",
    )
    flower_basic_auth: SecretStr | None = Field(
        None, description="Flower's basic auth, 'user:password'. Unset: generated once into "
        "data_dir/flower_basic_auth (mode 0600).",
    )
    webhook_secret: SecretStr | None = Field(
        None,
        description="Standard Webhooks signing secret (whsec_<base64>). Unset: one is generated "
        "on first use and kept in data_dir/webhook_secret (mode 0600).",
    )
    webhook_max_attempts: int = Field(6, gt=0, description="Delivery attempts per webhook.")
    webhook_backoff_s: float = Field(
        1.0, gt=0, description="First retry delay; it doubles after each failed attempt."
    )
    webhook_timeout_s: float = Field(
        5.0, gt=0, description="Deadline of one delivery attempt as a whole: name resolution, "
        "connect, TLS, sending the event and reading the (capped) response.",
    )
    webhook_allowed_networks: Annotated[tuple[IPvAnyNetwork, ...], NoDecode] = Field(
        (), description="Comma-separated CIDRs webhooks may be delivered to although they are "
        "loopback, private, link-local etc. (refused otherwise), e.g. 127.0.0.0/8 for a "
        "receiver on this host in development and tests. Empty: only public addresses.",
    )
    webhook_secret_grace_s: float = Field(
        24 * 3600.0, ge=0, description="After a team's webhook signing secret is rotated, how "
        "long events still carry a signature made with the old one as well.",
    )

    @field_validator("fleet", mode="before")
    @classmethod
    def _fleet_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(parse_fleet_entries(value)) if value.strip() else ()
        return value

    @field_validator("flower_host")
    @classmethod
    def _loopback_only(cls, value: str) -> str:
        """Flower asks for its basic auth on its UI and API, but not on /metrics and
        /healthcheck (Flower 2): bound beyond the loopback, they answer anyone who reaches it."""
        try:
            loopback = value == "localhost" or ipaddress.ip_address(value).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(
                f"{value!r} is not a loopback address: Flower's /metrics and /healthcheck answer "
                "without credentials, so it binds to 127.0.0.1 (or ::1) only; reach it through "
                "an SSH tunnel, or a proxy that asks for credentials on every path")
        return value

    @field_validator("webhook_allowed_networks", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return tuple(p.strip() for p in value.split(",") if p.strip()) if isinstance(
            value, str) else value

    # --- autoscaling (workers/autoscale, docs/autoscaling.md) --------------------------------
    autoscale: bool = Field(
        False, description="Follow demand: every autoscale_interval_s the autoscaler sizes each "
        "model's instances from its recent requests, within each fleet entry's min_count and "
        "max_count, and the local stack starts and drains engine workers to match.",
    )
    autoscale_interval_s: float = Field(
        10.0, gt=0, description="How often the autoscaler decides.",
    )
    autoscale_window_s: float = Field(
        300.0, gt=0, description="Requests that arrived this recently are the demand the "
        "autoscaler sizes for (rate, prompt and output lengths).",
    )
    autoscale_headroom: float = Field(
        1.25, ge=1, description="Capacity the autoscaler keeps over the forecast rate (1.25: "
        "instances for 125 %).",
    )
    autoscale_scale_down_after_s: float = Field(
        300.0, ge=0, description="How long an instance must be surplus, decision after "
        "decision, before the autoscaler removes it (scale-up is immediate).",
    )
    autoscale_drain_timeout_s: float = Field(
        300.0, gt=0, description="How long an instance being removed may take to finish its "
        "running requests; past it the drain is reported (with the worker's pid) and the "
        "instance keeps running: nothing is killed mid-answer unless the operator does it.",
    )
    autoscale_max_wait_s: float = Field(
        300.0, gt=0, description="Longest a request for a model at zero instances is held "
        "while one starts; after it, 503 with Retry-After.",
    )
    autoscale_catalog: Path | None = Field(
        None, description="GPU catalog (JSON: a list of kinds, each with `name` and "
        "`price_per_hour`) that prices fleet entries by their gpu_kind: the autoscaler adds "
        "the kind closing the gap at the lowest cost and removes the most expensive first. "
        "Unset: no prices; each entry scales within its own bounds.",
    )

    # --- files and batches (OpenAI Files and Batch API) --------------------------------------
    files_dir: Path | None = Field(
        None,
        description="Directory holding the files of the Files API (batch input, output and "
        "error files). Unset: data_dir/files. Every API and batch worker must see the same one.",
    )
    files_storage: Literal["disk", "database"] = Field(
        "disk",
        description="Where the Files API keeps file contents: `disk` (files_dir, one host or a "
        "shared file system) or `database` (PostgreSQL, table file_chunks: every host that "
        "reaches the database reads them; for API and batch workers on several hosts).",
    )
    max_file_bytes: int = Field(
        200 * 1024 * 1024, gt=0, description="Largest file POST /v1/files accepts (OpenAI: 200 "
        "MB per batch input file); larger uploads get HTTP 413.",
    )
    max_batch_lines: int = Field(
        50_000, gt=0, description="Most requests (non-blank lines) one batch input file may "
        "hold (OpenAI: 50,000): a longer file gets HTTP 400 at upload (purpose batch) and at "
        "batch creation.",
    )
    max_batch_file_bytes: int = Field(
        200 * 1024 * 1024, gt=0, description="Largest batch input file (OpenAI: 200 MB; an "
        "upload is also bound by max_file_bytes): a larger upload with purpose batch gets HTTP "
        "413, a batch on a larger file HTTP 400.",
    )
    max_batch_in_flight: int = Field(
        256, gt=0, description="Batch requests released to the pipeline and not finished yet, "
        "over all batches; the releaser shares these slots among teams by their share.",
    )
    batch_headroom_ttft_s: float = Field(
        0.0, ge=0, description="Interactive TTFT p99 (s) that batch work must not push past "
        "(workers/batch/headroom.py): the releaser's window of batch requests in flight grows "
        "by batch_headroom_increase per round while interactive requests finished over the "
        "last batch_headroom_window_s meet it and no engine queue grows, and halves otherwise, "
        "between batch_headroom_min_window and max_batch_in_flight. 0: off, a fixed "
        "max_batch_in_flight.",
    )
    batch_headroom_window_s: float = Field(
        30.0, gt=0, description="Interactive requests finished this recently give the TTFT "
        "p99 the batch window is steered by.",
    )
    batch_headroom_min_window: int = Field(
        4, ge=0, description="Batch requests always allowed in flight, however busy "
        "interactive traffic is (the batch still progresses; 0 lets it stop).",
    )
    batch_headroom_increase: float = Field(
        4.0, gt=0, description="Slots the batch window gains per release round without harm.",
    )
    batch_headroom_slot_margin: float = Field(
        2.0, description="With batch_headroom_ttft_s on, the batch window is also at most the "
        "live engines' slots (max_num_seqs summed) less the interactive requests expected in "
        "them (their engine seconds over the last batch_headroom_window_s, per second) plus this "
        "many Poisson standard deviations of that count: bursts find a free slot, as a running "
        "batch line keeps its slot (engines preempt for KV blocks only). Negative: no bound.",
    )
    batch_release_interval_s: float = Field(
        1.0, gt=0, description="How often beat runs the batch releaser (which also hands "
        "finished batches to finalization). Each run costs an idle stack CPU; a slot freed "
        "waits at most this long for the next line (max_batch_in_flight lines run meanwhile).",
    )
    batch_expiry_check_interval_s: float = Field(
        10.0, gt=0, description="How often beat looks for batches past their completion window.",
    )
    batch_eta_interval_s: float = Field(
        60.0, ge=0, description="How often beat estimates every running batch's completion "
        "time again (workers/batch/estimates.py; a batch is also estimated as it is "
        "validated). 0: only at validation.",
    )
    batch_eta_max_lines: int = Field(
        2000, gt=0, description="Lines of a batch its completion estimate simulates at most; "
        "a larger batch is sampled evenly and its duration scaled by its line count.",
    )
    batch_completion_window_s: float = Field(
        24 * 3600.0, gt=0, description="Length of the batch completion window `24h` (shorter "
        "only for tests): a batch not finished this long after creation expires.",
    )

    # --- retention and storage quotas (domain/retention.py, domain/file_quota.py) ---------------
    purge_interval_s: float = Field(
        3600.0, ge=0, description="How often beat runs the retention purge on the health "
        "worker (0: never on a schedule; `blockq purge` still works).",
    )
    purge_chunk_rows: int = Field(
        1000, gt=0, description="Rows the purge deletes per transaction (short transactions, "
        "no table lock).",
    )
    retain_requests_days: float = Field(
        30.0, ge=0, description="Finished requests (with their events and webhook deliveries) "
        "are deleted this long after they finished; requests in flight and those of running "
        "batches never are. 0: kept forever.",
    )
    retain_outcomes_days: float = Field(
        90.0, ge=0, description="Request history rows (request_outcomes: prompts, predicted "
        "and actual lengths, what online learning trains on) are deleted this long after the "
        "request finished. 0: kept forever.",
    )
    retain_step_samples_days: float = Field(
        7.0, ge=0, description="Engine step samples (what exec-model refits use) are deleted "
        "after this long. 0: kept forever.",
    )
    retain_webhook_deliveries_days: float = Field(
        30.0, ge=0, description="Webhook delivery attempts are deleted after this long (they "
        "also go with their request). 0: kept forever.",
    )
    retain_batches_days: float = Field(
        30.0, ge=0, description="Finished batches (completed, failed, expired, cancelled) with "
        "no request left are deleted this long after they finished; their files follow their "
        "own expires_at. 0: kept forever.",
    )
    retain_model_versions_days: float = Field(
        90.0, ge=0, description="Candidate and retired model versions older than this are "
        "deleted; the active version and each scope's rollback target are always kept. 0: "
        "kept forever.",
    )
    storage_quota_bytes: int = Field(
        10 * 1024**3, ge=0, description="Bytes of stored files a team may hold (uploads and "
        "batch outputs), unless the team has its own quota (`blockq teams create --storage-"
        "quota`); an upload past it gets HTTP 403 storage_quota_exceeded. Unset: no quota.",
    )

    log_level: str = Field("INFO", description="Log level of every blockq process.")

    # --- logs and metrics ----------------------------------------------------------------------
    log_format: Literal["json", "text"] = Field(
        "json", description="Log lines of every blockq process: one JSON object per line (time, "
        "level, logger, message, role, request_id), or plain text.",
    )
    metrics_port: int | None = Field(
        None, gt=0, lt=65536, description="Port on which a Celery worker serves its own "
        "Prometheus metrics (for a worker with no API beside it, e.g. an engine in its own "
        "container; give each worker on a host its own port). Unset: no metrics server; the "
        "API's GET /metrics serves every process of the local stack.",
    )
    metrics_host: str = Field(
        "127.0.0.1", description="Address a worker's metrics server (metrics_port) binds to."
    )
    metrics_token: SecretStr | None = Field(
        None, description="When set, the API's GET /metrics answers only `Authorization: "
        "Bearer <token>` (401 otherwise). Unset: /metrics is open (keep it off public networks).",
    )
    metrics_counts_cache_s: float = Field(
        60.0, ge=0, description="GET /metrics counts finished requests by status at most this "
        "often (cached in Redis for every API process); requests in flight are counted at every "
        "scrape through an index.",
    )
    log_request_content: bool = Field(
        False, description="Debug only: let prompts, outputs and SQL parameters appear in log "
        "lines (SQLAlchemy errors render bound parameters). Off: they never do.",
    )
    prometheus_multiproc_dir: Path | None = Field(
        None,
        validation_alias=AliasChoices("PROMETHEUS_MULTIPROC_DIR",
                                      "BLOCKQ_PROMETHEUS_MULTIPROC_DIR"),
        description="Directory where the processes of one host write their metrics for the "
        "API's GET /metrics to add up (prometheus_client's multi-process mode, which reads "
        "the variable itself at import). The local stack sets it to data_dir/prometheus and "
        "empties it at start. Unset: /metrics shows the API process's own metrics only.",
    )

    @model_validator(mode="after")
    def _engine_pool_holds_the_batch(self) -> Settings:
        needed = self.max_batch_in_flight + self.max_num_seqs
        if self.engine_concurrency < needed:
            raise ValueError(
                f"BLOCKQ_ENGINE_CONCURRENCY ({self.engine_concurrency}) must be at least "
                f"BLOCKQ_MAX_BATCH_IN_FLIGHT + BLOCKQ_MAX_NUM_SEQS ({needed}): each request on "
                "an engine worker holds one of its threads, and batch lines could take them "
                "all, leaving interactive requests waiting in the broker")
        return self

    @model_validator(mode="after")
    def _fleet_kinds_in_the_catalog(self) -> Settings:
        if self.autoscale_catalog is None:
            return self
        missing = missing_kinds([entry.gpu_kind for entry in self.fleet], self.gpu_prices)
        if missing:
            raise ValueError("; ".join(missing))
        return self

    @property
    def gpu_prices(self) -> dict[str, float]:
        """GPU kind -> price per hour from autoscale_catalog ({} when unset)."""
        if self.autoscale_catalog is None:
            return {}
        try:
            return parse_prices(self.autoscale_catalog.read_text())
        except OSError as exc:
            raise CatalogError(f"GPU catalog {self.autoscale_catalog}: {exc.strerror}") from None

    @classmethod
    def load(cls) -> Settings:
        """Settings from the environment, over the file named by BLOCKQ_CONFIG_FILE if set."""
        config_file = os.environ.get("BLOCKQ_CONFIG_FILE")
        return cls(_env_file=config_file) if config_file else cls()

    def as_env(self) -> dict[str, str]:
        """These settings as environment variables, for child processes of the local stack."""
        env: dict[str, str] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is None or (name in _PASSED_ONLY_WHEN_SET
                                 and name not in self.model_fields_set):
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            elif isinstance(value, Path):
                value = value.resolve()
            elif name == "fleet":
                if not value:
                    continue
                value = json.dumps([spec.model_dump(mode="json", exclude_none=True) | (
                    {"model_path": str(spec.model_path.resolve())} if spec.model_path else {})
                    for spec in value])
            elif isinstance(value, tuple):
                value = ",".join(map(str, value))
            elif isinstance(value, dict):
                value = json.dumps(value)  # as pydantic-settings reads it back
            env[self.env_name(name)] = str(value)
        return env

    @staticmethod
    def env_name(field_name: str) -> str:
        return _ENV_NAMES.get(field_name, f"BLOCKQ_{field_name.upper()}")

    @property
    def routes_in_api(self) -> bool:
        """Whether the API routes its held completions itself (`route_in_api`, which late
        binding turns off: the route worker releases what it holds)."""
        return self.route_in_api and not self.routing_hold

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def broker_is_rabbitmq(self) -> bool:
        return self.resolved_broker_url.startswith(("amqp://", "amqps://", "pyamqp://"))

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'blockq.sqlite3').resolve()}"

    @property
    def resolved_model_path(self) -> Path:
        return self.model_path or self.data_dir / "models" / "tiny-llama"

    @property
    def resolved_files_dir(self) -> Path:
        return self.files_dir or self.data_dir / "files"

    @property
    def fleet_slots(self) -> list[FleetSlot]:
        """Every instance the local stack may run, in queue order (slot k is gpu.<k>), each
        with its entry (every field filled in) and whether it runs at start."""
        declared = self.fleet or (InstanceSpec(model=self.model_name,
                                               count=self.num_instances),)
        return fleet_slots([self._filled_in(entry) for entry in declared])

    @property
    def instances(self) -> list[InstanceSpec]:
        """The local stack's instances in queue order (instance k is gpu.<k>), every field
        filled in: `fleet`, else num_instances instances of model_name. An autoscaled entry
        gives its max_count, running or not."""
        return [slot.spec for slot in self.fleet_slots]

    @property
    def initial_instance_ids(self) -> list[str]:
        """The instances that run at start (each entry's first `count`)."""
        return [slot.instance_id for slot in self.fleet_slots if slot.starts_running]

    def _filled_in(self, spec: InstanceSpec) -> InstanceSpec:
        return spec.model_copy(update={
            "model_path": (spec.model_path or (self.resolved_model_path
                                               if spec.model == self.model_name
                                               else self.data_dir / "models" / spec.model)),
            "engine": spec.engine or self.engine_kind,
            "exec_model": spec.exec_model or self.emulated_exec_model,
        })

    def routing_policy_for(self, mixed_hardware: bool) -> str:
        """The configured routing policy of a model's pool: `routing_policy` when set, or for
        a pool of alike instances; `mixed_fleet_routing_policy` for one of unlike instances
        when it is not."""
        if mixed_hardware and "routing_policy" not in self.model_fields_set:
            return self.mixed_fleet_routing_policy
        return self.routing_policy

    @property
    def instance_ids(self) -> list[str]:
        """Instance ids of the local stack; each is also the name of its Celery queue."""
        return [f"gpu.{k}" for k in range(len(self.instances))]

    @property
    def default_model(self) -> str:
        """The model of a native request that names none: the first instance's (read on every
        request: not through `instances`, which copies each spec)."""
        return self.fleet[0].model if self.fleet else self.model_name

    def for_instance(self, instance_id: str) -> Settings:
        """These settings as engine instance `instance_id` (gpu.<k>) of the fleet runs them:
        its model's name and path, engine kind and emulated hardware. An instance the fleet
        does not list (an engine started by hand on queue gpu.emu0) runs these settings as
        they are."""
        ids = self.instance_ids
        if instance_id not in ids:
            return self
        spec = self.instances[ids.index(instance_id)]
        sized = {name: value for name, value in (
            ("emulated_num_blocks", spec.num_blocks), ("max_num_seqs", spec.max_num_seqs),
            ("instance_capacity_rps", spec.capacity_rps),
            ("emulated_start_s", spec.start_s)) if value is not None}
        return self.model_copy(update={
            "model_name": spec.model, "model_path": spec.model_path,
            "engine_kind": spec.engine, "emulated_exec_model": spec.exec_model, **sized})


def describe_invalid(error: ValidationError) -> str:
    """What is wrong with the settings, one line a problem, each naming its variable (and the
    value given, unless it may carry a secret)."""
    lines = []
    for problem in error.errors(include_url=False):
        message = problem["msg"].removeprefix("Value error, ")
        if problem["loc"]:
            field_name = str(problem["loc"][0])
            name = Settings.env_name(field_name) if field_name in Settings.model_fields else (
                field_name)
            given = "" if _may_hold_a_secret(field_name) else f" (got {problem['input']!r})"
            message = f"{name}: {message}{given}"
        lines.append(message)
    return "invalid settings:\n  " + "\n  ".join(lines)


def _may_hold_a_secret(field_name: str) -> bool:
    """A secret setting, a URL (which may carry a password), or a name this cannot tell
    (an alias: the URLs are named by theirs)."""
    field = Settings.model_fields.get(field_name)
    return field_name.endswith("_url") or field is None or SecretStr in (
        field.annotation, *get_args(field.annotation))
