"""kq's PySpark data source: `spark.read.format("kq")` and `spark.readStream.format("kq")`.

It reads kq topics with the schema and options of Spark's Kafka source, from followers by default,
as Arrow record batches. Needs the `spark` extra (`pip install -e ".[spark]"`: pyspark, pyarrow).

    from kq.spark import KqDataSource
    session.dataSource.register(KqDataSource)
    df = (session.read.format("kq").option("kq.nodes", "127.0.0.1:9101")
          .option("subscribe", "events").load())

Modules: `options` (parsing, one error per bad option), `planning` (pure offset-range planning),
`metadata` (the driver's calls: cluster view, one offsets snapshot), `fetching` (the executor's
read with node failover), `schema` (Kafka's schema, Arrow batches), `source` (the Spark classes),
`session` (a quiet local SparkSession), `jobs/` (example jobs). README.md says more.
"""

import os

# grpcio >= 1.81 runs its fork handlers in the child of every fork (grpc/grpc#43055): with gRPC
# channels busy in the driver, the child PySpark forks (with preexec_fn) to exec the JVM died now and
# then before exec ("Java gateway process exited": measured 4-5 of 300 forks). The driver forks only
# to exec, so it needs no gRPC fork support; this must be set before kq.client imports grpc (a
# program that imported grpc earlier sets it itself).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from kq.spark.options import DataLossError, KqSourceError
from kq.spark.source import KqDataSource

__all__ = ["DataLossError", "KqDataSource", "KqSourceError"]
