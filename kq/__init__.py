"""kq: a Kafka-compatible, Raft-replicated log broker.

Every part of kq lives in this one import namespace: `kq.proto` (the wire contract: gRPC services,
the Raft command envelope, error codes and limits), `kq.storage` (LMDB logs), `kq.raft` (the
replicated state machine), `kq.broker` (the node), `kq.client` (the Python client library),
`kq.cli` (the `kq` command), `kq.spark` (the PySpark data source), `kq.chaos`, `kq.bench` and
`kq.deploy` (the harness that starts local nodes). In the repository each is a top-level folder;
pyproject maps them into this package (see DESIGN.md, "Packages").
"""

__version__ = "0.1.0"
