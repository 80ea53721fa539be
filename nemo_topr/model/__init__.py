"""Model plumbing: where a model comes from (sources, checkpoints' layout, HF weights), how it is built for
this machine (providers, settings, device, the CPU runtime), and the checks on what will run (attention)."""
