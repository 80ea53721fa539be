"""One progress line for long loops (`generate`, `eval`, `score-logprobs`): done/total, rate, ETA.

Printed to stderr at most every `interval_s` seconds and when the work is complete, so a log
shows a run is alive without a line per item.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

T = TypeVar("T")


def duration(seconds: float) -> str:
    """`1h02m`, `4m10s`, `12s`."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else (f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s")


class Progress:
    """`[what] done/total unit (share), rate unit/s, ETA` lines. `done` may start above 0 (a resume);
    the rate counts only what this process did."""

    def __init__(self, what: str, total: int, unit: str, *, done: int = 0, interval_s: float = 10.0,
                 stream: TextIO | None = None):
        self.what, self.total, self.unit, self.done = what, total, unit, done
        self.interval_s, self.stream = interval_s, stream or sys.stderr
        self.started = time.monotonic()
        self.started_at, self.last_print = done, -float("inf")

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if self.done >= self.total or now - self.last_print >= self.interval_s:
            self.last_print = now
            print(self.line(now - self.started), file=self.stream, flush=True)

    def line(self, elapsed: float) -> str:
        share = f" ({100 * self.done / self.total:.1f}%)" if self.total else ""
        rate = (self.done - self.started_at) / elapsed if elapsed > 0 else 0.0
        left = self.total - self.done
        eta = duration(left / rate) if rate > 0 else "unknown"
        return (f"[{self.what}] {self.done}/{self.total} {self.unit}{share}, {rate:.2f} {self.unit}/s, "
                f"{'done in ' + duration(elapsed) if left <= 0 else 'ETA ' + eta}")

    def wrap(self, items: Iterable[T]) -> Iterator[T]:
        """Yield `items`, advancing by one when the next is asked for (the previous one is done
        then); a consumer that stops asking after the last calls `finish`."""
        for item in items:
            yield item
            self.advance()

    def finish(self) -> None:
        if self.done < self.total:
            self.advance(self.total - self.done)
