"""A local, quiet SparkSession with the kq source registered: for the example jobs and the tests.

Loopback only (driver host and bind address 127.0.0.1), no web UI, no progress bars, Spark's own
logging at ERROR, and the executors' Python is this interpreter (so they import this kq).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from kq.spark.source import KqDataSource

LOOPBACK = "127.0.0.1"
CORES_DEFAULT = 2
SHUFFLE_PARTITIONS_DEFAULT = 4  # Spark's 200 is for clusters; small local jobs pay per partition.
LOG_LEVEL = "ERROR"
QUICK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# Spark's JVM logs through log4j2; its default profile logs WARN lines at start-up (native Hadoop, ...).
LOG4J2_PROPERTIES = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
"""


def local_session(
    app_name: str,
    cores: int = CORES_DEFAULT,
    config: Mapping[str, str] | None = None,
    quick_jvm: bool = False,
    task_attempts: int = 1,
) -> SparkSession:
    """A local[cores] session (or the running one) with format("kq") registered.

    `quick_jvm` (for short runs such as tests) trades the JVM's peak speed for a faster, leaner start:
    only the C1 compiler and the serial garbage collector. `task_attempts`: how often Spark runs a
    failing task before the job fails (local mode's default, 1, never retries).
    """
    java_options = f"-Dlog4j2.configurationFile=file:{_log4j2_file()}"
    if quick_jvm:
        java_options += f" {QUICK_JVM_OPTIONS}"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)  # Else Spark warns that the host name is loopback.
    settings = {
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS_DEFAULT),
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": java_options,
        **(config or {}),
    }
    master = f"local[{cores}]" if task_attempts == 1 else f"local[{cores},{task_attempts}]"
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(LOG_LEVEL)
    session.dataSource.register(KqDataSource)
    return session


def _log4j2_file() -> Path:
    """The log4j2 configuration file (written once; replaced atomically, so concurrent runs agree)."""
    path = Path(tempfile.gettempdir()) / "kq-spark-log4j2.properties"
    if not path.exists() or path.read_text() != LOG4J2_PROPERTIES:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
            handle.write(LOG4J2_PROPERTIES)
        os.replace(handle.name, path)
    return path
