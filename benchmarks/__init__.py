"""blockq's benchmarks and fault-injection rigs, as a package with tests.

`scripts/` holds their command lines (argument parsing and a call); the logic lives here:

- `paths`: where the checkout, its tiny model and the shared data are.
- `tables`: a result table printed for the terminal or as Markdown, and cell formats.
- `stats`: percentiles as every benchmark computes them.
- `quiet`: a measurement runs alone (the test services' lock) and starts on a quiet machine
  (the load average, printed at the start and the end).
- `services_lock`: one test run or benchmark at a time on a test database and Redis db.
- `chaos`: the chaos run (processes killed under a mixed load, delivery guarantees checked).
- `multihost`: the same across hosts made of network namespaces.
- `live`: the live routing benchmark on the real stack with emulated GPUs.

Benchmarks import `app` and `workers`; nothing in `app` or `workers` imports them.
"""
