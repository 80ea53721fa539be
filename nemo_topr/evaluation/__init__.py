"""Sampling (`nemo-topr generate`), benchmark metrics and evaluation (`nemo-topr eval`)."""
