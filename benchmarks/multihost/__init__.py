"""The multi-host rig (scripts/multihost.py is its command line; docs/deploy.md, "Several hosts",
and docs/multihost.md say what it does): blockq's hosts made of network namespaces on one bridge,
host-level faults during a run, and the chaos run's checks (`benchmarks.chaos`) after it.

- `network`: namespaces, the bridge, veth pairs and addresses; partitions; cleanup by prefix.
- `layout`: which hosts there are, their addresses and the processes each runs.
- `hosts`: a host's processes (a `Stack` whose commands run in the host's namespace under its
  own hostname), killed all at once and started again.
- `balancer`: HAProxy in front of the control hosts' APIs.
- `faults`: the host-level fault kinds and their injection.
- `summary`: the last line's JSON (lost, completed_twice, missing_webhooks, not_terminal...).
- `run`: one run, start to finish.

"""
