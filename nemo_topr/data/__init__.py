"""Offline pre-scored data: validated records -> token ids -> packed batches (docs/data.md).

records.py (schema, reading, validation, report) -> tokenization.py -> packing.py;
curation.py, stats.py and prompts.py work on records; cli.py is `nemo-topr data`.
Nothing here imports Megatron.
"""
