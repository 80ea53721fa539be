"""argparse types shared by the verbs' command lines."""

from __future__ import annotations

import argparse


def at_least_one(text: str) -> int:
    """An integer count of at least 1 (a batch size, rows per batch): 0 or a negative one is a
    usage error, not a `range()` that runs no batch and writes an empty output."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1; got {value}")
    return value
