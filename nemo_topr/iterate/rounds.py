"""What a round (or the start) leaves in its directory, which the driver and the summary read back,
and what it came to (`RoundResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nemo_topr.data.records import Record


def wrote_no_records(path: Path) -> bool:
    """`generate`'s (or eval's `--samples-out`) file is empty: every completion was empty."""
    return not path.read_text(encoding="utf-8").strip()


def read_graded(path: Path) -> list[Record]:
    """The records `generate` wrote: none when every completion was empty (an empty file)."""
    from nemo_topr.data.records import load_records

    if wrote_no_records(path):
        return []
    return load_records(path).records


@dataclass(frozen=True)
class RoundFiles:
    """What the stages of a round (or of the start) write in its directory; the summary reads them back."""
    directory: Path

    graded = property(lambda self: self.directory / "graded.jsonl")
    curated = property(lambda self: self.directory / "curated.jsonl")
    scored = property(lambda self: self.directory / "scored.jsonl")
    run_dir = property(lambda self: self.directory / "run")
    model = property(lambda self: self.directory / "model")
    eval_results = property(lambda self: self.directory / "eval.json")
    eval_samples = property(lambda self: self.directory / "eval_samples.jsonl")
    verified_samples = property(lambda self: self.directory / "eval_samples_verified.jsonl")
    verified_results = property(lambda self: self.directory / "eval_verified.json")


@dataclass
class RoundResult:
    label: str
    directory: Path
    model: Path  # the HF model this round produced (its starting model when it had nothing to train on)
    weights: str  # the same model as `base_model` of the next round's training: its run directory
    evaluated: bool = True  # False: nothing to train on, nothing new to evaluate
    note: str | None = None
