"""Reading LeanDojo Benchmark 4 data and serving it to Lightning."""
