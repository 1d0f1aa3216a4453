"""kq benchmarks: three real nodes on 127.0.0.1, produce/fetch throughput, latency, node memory and CPU."""
