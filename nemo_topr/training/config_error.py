"""The error of a run config that cannot work, with the dotted key that caused it."""

from __future__ import annotations

from nemo_topr.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration problem, with the dotted key that caused it."""
