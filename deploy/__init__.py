"""deploy: the one harness that starts, watches and stops local kq nodes.

Tests, chaos scenarios, benchmarks and `deploy/run-cluster.sh` all start nodes through it.
"""
