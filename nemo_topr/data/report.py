"""What reading a dataset did with every record: how many were read, used and dropped, and why."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from nemo_topr.data.schema import DataError


@dataclass
class ValidationReport:
    """What happened to every record: records_in = records_used + sum(dropped.values())."""

    files: list[str] = field(default_factory=list)
    records_in: int = 0
    records_used: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    first_error: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def reject(self, reason: str, error: DataError, strict: bool) -> None:
        """Raise `error` when strict; otherwise count one dropped record under `reason`."""
        if strict:
            raise error
        self.dropped[reason] += 1
        self.first_error.setdefault(reason, str(error))

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "records_in": self.records_in,
            "records_used": self.records_used,
            "records_dropped": sum(self.dropped.values()),
            "dropped": dict(sorted(self.dropped.items())),
            "first_error": dict(sorted(self.first_error.items())),
            "notes": self.notes,
        }

    def format(self) -> str:
        lines = [
            f"files: {len(self.files)}",
            f"records in: {self.records_in}",
            f"records used: {self.records_used}",
            f"records dropped: {sum(self.dropped.values())}",
        ]
        for reason, count in sorted(self.dropped.items()):
            lines.append(f"  {reason}: {count}  (first: {self.first_error[reason]})")
        return "\n".join(lines + self.notes)
