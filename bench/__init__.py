"""Benchmarks of nemo_topr (``make bench``); see bench/README.md."""
