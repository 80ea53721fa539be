"""The record schema's field names and the located data error, shared by reading and validation."""

from __future__ import annotations

from pathlib import Path

from nemo_topr.errors import UserError

REQUIRED_FIELDS = ("prompt", "completion", "reward")
OPTIONAL_FIELDS = ("behavior_logprob", "prompt_id", "sample_id", "baseline", "meta")
FIELDS = REQUIRED_FIELDS + OPTIONAL_FIELDS


def located(path: str | Path, line: int, field: str) -> str:
    """Where a data problem is: ``path:line: field``, ``path: field`` for line 0, `field` for no path."""
    location = f"{path}:{line}" if line else str(path)
    return f"{location}: {field}" if location else field


class DataError(UserError, ValueError):
    """A data problem located as `path:line: field: problem`; line 0 is the file or dataset as a
    whole, written `path: field: problem` (editors read `path:0:` as a line that is not there)."""

    def __init__(self, path: str | Path, line: int, field: str, problem: str, *, key: str | None = None,
                 where: str | None = None):
        """`key` names the problem (``"record.reward.not_a_number"``); `where` is ``path:line: field``
        (``path: field`` for line 0) unless given."""
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        at = located(self.path, line, field)
        super().__init__(f"{at}: {problem}", key=key, where=at if where is None else where)


class RejectedRow(Exception):
    """A record-level problem: raised when strict, dropped and counted under `reason` otherwise."""

    def __init__(self, reason: str, error: DataError):
        super().__init__(str(error))
        self.reason, self.error = reason, error
