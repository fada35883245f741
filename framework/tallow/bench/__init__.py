"""`tallow bench`: latency, throughput and serving benchmarks."""
