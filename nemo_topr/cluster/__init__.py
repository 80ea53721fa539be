"""Cluster recipes: `nemo-topr plan` (pre-flight check of a parallel layout and per-GPU memory)
and the Slurm submission helpers."""
