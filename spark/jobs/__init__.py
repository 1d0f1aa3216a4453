"""Example Spark jobs over kq, each runnable as `python -m kq.spark.jobs.<name>` (see spark/README.md).

- `key_minute_stats`: batch; reads a topic from followers, writes record counts and bytes per key per
  minute to Parquet, prints a summary (which nodes served the read, throughput, top keys).
- `stream_to_parquet`: streaming with trigger(availableNow=True); each run appends only the records
  produced since the previous run (Spark's checkpoint holds Kafka-shaped offsets).
- `read_throughput`: batch read throughput (records/s, median of several runs) of a large topic.
"""
