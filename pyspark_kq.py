"""Spark's static registration of `format("kq")`: Spark imports every top-level module whose name starts
with `pyspark_` and registers its `DefaultSource`, so `spark.read.format("kq")` (and `df.write`) work in
any session whose Python workers can import kq, with no setup call. The one name kq installs outside its
`kq` namespace, because Spark looks for exactly this shape (pyspark/sql/worker/lookup_data_sources.py).
"""

from kq.spark import KqDataSource as DefaultSource

__all__ = ["DefaultSource"]
