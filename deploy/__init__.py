"""deploy: the one harness that starts, watches and stops local kq nodes.

Tests, chaos scenarios, benchmarks and `deploy/run-cluster.sh` all start nodes through it:

- `cluster`: `LocalCluster` (real `kq-node` processes, their ports, data directories and logs) and
  `agreed_leader`, the one definition of "the leader".
- `processes`: `ProcessTable`, processes by PID (children, or adopted from PID files).
- `waiting`: `wait_for`, the one wait on a condition with a deadline.
- `reading`: `read_partition`, one node's copy of a partition, for checks that compare nodes.
- `certs`: a cluster's CA and node and client certificates; `tls_probe`: proof that a cluster made
  with `tls_dir` refuses plain text (for secure chaos runs and benchmark columns).
- `provenance`: the git commit a run's report names.
- `cli` (`python -m kq.deploy`): a cluster that outlives the command, for `run-cluster.sh`.
"""
