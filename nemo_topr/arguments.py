"""argparse types shared by the verbs' command lines."""

from __future__ import annotations

import argparse
import math
from typing import Any


def at_least_one(text: str) -> int:
    """An integer count of at least 1 (a batch size, rows per batch): 0 or a negative one is a
    usage error, not a `range()` that runs no batch and writes an empty output."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1; got {value}")
    return value


def non_negative(text: str) -> int:
    """A saved iteration's number: a negative one named a directory like iter_-000001."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0; got {value}")
    return value


def finite(text: str) -> float:
    """A finite number (a baseline): NaN passes every comparison, so `data validate` took it
    without a word."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number; got {text}")
    return value


def positive_seconds(text: str) -> float:
    """A time limit in seconds above 0: 0, a negative or a non-finite one is a usage error, not
    a limit every check fails (after the model is built) or none meets."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0; got {text}")
    return value


def share(text: str) -> float:
    """A share in [0, 1] (a rate, a fraction of samples): another value is a usage error. A
    negative one failed every run after its sampling, NaN compared false and never failed."""
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a share in [0, 1]; got {text}")
    return value


def documented(doc: str) -> dict[str, Any]:
    """ArgumentParser keywords for a verb whose module docstring is its help: the first paragraph as
    the description, the rest as the epilog (the whole docstring there printed that paragraph twice)."""
    description, _, rest = doc.partition("\n\n")
    return {"description": description, "epilog": rest or None, "formatter_class": argparse.RawDescriptionHelpFormatter}
