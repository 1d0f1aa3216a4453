"""kq's PySpark data source: `spark.read.format("kq")`, `spark.readStream.format("kq")`, and the sink,
`df.write.format("kq")` and `df.writeStream.format("kq")`.

It reads kq topics with the schema and options of Spark's Kafka source, from followers by default,
as Arrow record batches, and writes DataFrames with the columns of Spark's Kafka sink. Needs the
`spark` extra (`pip install -e ".[spark]"`: pyspark, pyarrow).

    import kq.spark   # format("kq") for the running session, or for any started after this import
    df = (spark.read.format("kq").option("kq.nodes", "127.0.0.1:9101")
          .option("subscribe", "events").load())
    df.write.format("kq").option("kq.nodes", "127.0.0.1:9101").option("topic", "copy").save()

How `format("kq")` is found: Spark itself registers the `DefaultSource` of every importable top-level
`pyspark_*` module (kq installs `pyspark_kq`), in the Python its workers run. Importing this package
makes that Python this interpreter (PYSPARK_PYTHON, unless set) for sessions started afterwards, and
registers the source with a session already running; `register(spark)` does it for a given one.

Modules: `options` (parsing, one error per bad option), `planning` (pure offset-range planning),
`metadata` (the driver's calls: cluster view, one offsets snapshot), `fetching` (the executor's
read with node failover), `schema` (Kafka's schema, Arrow batches), `source` (the Spark classes),
`session` (a quiet local SparkSession), `jobs/` (example jobs). README.md says more.
"""

import os
import sys

# grpcio >= 1.81 runs its fork handlers in the child of every fork (grpc/grpc#43055): with gRPC
# channels busy in the driver, the child PySpark forks (with preexec_fn) to exec the JVM died now and
# then before exec ("Java gateway process exited": measured 4-5 of 300 forks). The driver forks only
# to exec, so it needs no gRPC fork support; this must be set before kq.client imports grpc (a
# program that imported grpc earlier sets it itself).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# Spark's Python workers run PYSPARK_PYTHON (else `python3` from PATH, which may not hold kq): this one.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession

from kq.spark.options import DataLossError, KqSourceError
from kq.spark.sink import KqSinkError
from kq.spark.source import KqDataSource

__all__ = ["DataLossError", "KqDataSource", "KqSinkError", "KqSourceError", "register"]


def register(spark: SparkSession | None = None) -> SparkSession | None:
    """Registers `format("kq")` with `spark` (default: the active session, if any); returns it."""
    session = spark if spark is not None else SparkSession.getActiveSession()
    if session is not None:
        session.dataSource.register(KqDataSource)
    return session


register()
