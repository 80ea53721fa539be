"""The error of a run config that cannot work, with the dotted key that caused it."""

from __future__ import annotations

from nemo_topr.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration problem: `key` names the problem (``"optimizer.lr.below_min_lr"``), `where` the
    dotted config key it is about (``"optimizer.lr"``), both `UserError`'s."""
