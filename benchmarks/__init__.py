"""blockq's benchmarks and fault-injection rigs, as a package with tests.

`scripts/` holds their command lines (argument parsing and a call); the logic lives here:

- `paths`: where the checkout, its tiny model and the shared data are.
- `tables`: a result table printed for the terminal or as Markdown, and cell formats.
- `stats`: percentiles as every benchmark computes them.
- `quiet`: a measurement runs alone (the test services' lock) and starts on a quiet machine
  (the load average, printed at the start and the end).
- `services_lock`: one test run or benchmark at a time on a test database and Redis db.
- `local`: the benchmarks' own database and Redis db, emptied, and a stack on a run's settings.
- `artifacts`: how the tiny test models, the sample prompts, the bundled execution-time models
  and the length heads are made.
- `chaos`: the chaos run (processes killed under a mixed load, delivery guarantees checked).
- `multihost`: the same across hosts made of network namespaces.
- `live`: the live routing benchmark on the real stack with emulated GPUs.
- one module per benchmark (`cluster`, `sim`, `control_plane`, `length_eval`, ...), named as its
  script without `bench_`.

Benchmarks import `app` and `workers`; nothing in `app` or `workers` imports them.
"""
