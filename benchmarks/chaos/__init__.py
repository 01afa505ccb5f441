"""The chaos benchmark's harness (scripts/chaos.py is its command line; docs/chaos.md says what
it does and what each line of its report means). One module per job:

- `config`: what a run is asked to do (RunConfig).
- `services`: the run's own PostgreSQL and Redis (OwnServices), free ports.
- `stack_setup`: the stack's settings, environment and batch teams for a run.
- `receiver`: the webhook receiver that fails the first attempts of each event.
- `workload`: the mixed job of client threads and what each client saw (Outcome).
- `processes`: every exit of a stack process, and why (ProcessWatch); a process log's last error.
- `faults`: the fault kinds, their schedule and injection (Injector), crash-after-commit faults.
- `terminal`: the statuses after which a request or a batch changes no more.
- `settle`: waiting until every request, batch and webhook is done.
- `checks`: the delivery guarantees, checked after the run (Checker, Finding).
- `leftovers`: assignments and messages that stay in Redis after the run.
- `recovery`: how long the requests in flight at each fault took to finish.
- `summaries`: the faults and the workload in aggregate.
- `run`: one run, start to finish (run, RunResult).
- `report`: the result as tables.
"""
