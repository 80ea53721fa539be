"""The record schema's field names and the located data error, shared by reading and validation."""

from __future__ import annotations

from pathlib import Path

from nemo_topr.errors import UserError

REQUIRED_FIELDS = ("prompt", "completion", "reward")
OPTIONAL_FIELDS = ("behavior_logprob", "prompt_id", "sample_id", "baseline", "meta")
FIELDS = REQUIRED_FIELDS + OPTIONAL_FIELDS


class DataError(UserError, ValueError):
    """A data problem located as `path:line: field: problem`; line 0 is the file or dataset as a
    whole, written `path: field: problem` (editors read `path:0:` as a line that is not there). Its
    `where` is that location, ``path:line: field``; `key` names the problem."""

    def __init__(self, path: str | Path, line: int, field: str, problem: str, *, key: str | None = None):
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        located = f"{self.path}:{line}" if line else self.path
        where = f"{located}: {field}" if located else field
        super().__init__(f"{where}: {problem}", key=key, where=where)


class RejectedRow(Exception):
    """A record-level problem: raised when strict, dropped and counted under `reason` otherwise."""

    def __init__(self, reason: str, error: DataError):
        super().__init__(str(error))
        self.reason, self.error = reason, error
