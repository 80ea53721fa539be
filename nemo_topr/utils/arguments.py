"""argparse types shared by the verbs' command lines."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from nemo_topr.errors import UserError, nearest


class UsageError(UserError):
    """Options that do not go together, found after argparse accepted each: exit 2, as argparse's own."""

    exit_code = 2


class OptionValueError(UsageError, argparse.ArgumentTypeError):
    """A value an option's type refuses: argparse prints it after the option it was given to
    (``argument --batch-size: must be at least 1; got 0``), which the type does not know (`where`: OPTION)."""


# the run configs and presets (`train`, `plan`, `submit`, `iterate`); NEMO_TOPR_CONF_DIR for another set
CONF_DIR = Path(os.environ.get("NEMO_TOPR_CONF_DIR", Path(__file__).resolve().parents[2] / "conf"))

# an option as typed: `--name` or `--name=value`; a lone `--` ends the options
OPTION = re.compile(r"--[A-Za-z][\w-]*")


class Parser(argparse.ArgumentParser):
    """The verbs' ArgumentParser: a usage error also names each option it does not know, with the
    closest one it does (`--devcie: did you mean --device?`), or, for a verb that takes KEY=VALUE
    overrides, the setting's override (`train --device cpu`: device=cpu; `--lr`: optimizer.lr).
    Python 3.12's argparse says only "unrecognized arguments", and only once the required ones are
    there: `export --hf_out x` said that --hf-out was missing."""

    def __init__(self, *args, settings: Callable[[], Iterable[str]] | None = None, **kwargs):
        """`settings`: the dotted keys of the verb's KEY=VALUE overrides, read only for a usage error."""
        super().__init__(*args, **kwargs)
        self.settings = settings

    def parse_known_args(self, args=None, namespace=None):
        self.typed = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def known_options(self) -> set[str]:
        """This parser's long options, with those of the sub-command typed (`data stats --bogus` is
        reported by `data`'s parser)."""
        parsers = [self]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers += [action.choices[word] for word in self.typed if word in action.choices][:1]
        return {name for parser in parsers for name in parser._option_string_actions if name.startswith("--")}

    def unknown_options(self) -> dict[str, str | None]:
        """{option typed that is neither known nor a known one's prefix: what was meant, where
        something is close; else None}."""
        known = self.known_options()
        takes_overrides = any(action.dest == "overrides" for action in self._positionals._group_actions)
        typed = getattr(self, "typed", [])
        unknown = {}
        options = typed[: typed.index("--")] if "--" in typed else typed
        for place, word in enumerate(options):
            name, equals, value = word.partition("=")
            # a known option's prefix is argparse's abbreviation, or its "ambiguous option"
            if not OPTION.fullmatch(name) or any(option.startswith(name) for option in known):
                continue
            # compared without the dashes, which every name shares
            close = nearest(name[2:], [option[2:] for option in known])
            following = options[place + 1] if place + 1 < len(options) else "-"
            if close:
                unknown[name] = "--" + close[0]
            elif takes_overrides and (keys := self.settings_meant(name[2:].replace("-", "_"))):
                # a setting written as an option: `--device cpu` for device=cpu, `--lr` for optimizer.lr
                if not equals:
                    value = following if not following.startswith("-") and "=" not in following else "VALUE"
                unknown[name] = " or ".join(f"the override {key}={value}" for key in keys)
            else:
                unknown[name] = None
        return unknown

    def settings_meant(self, word: str) -> list[str]:
        """The setting keys `word` names: itself, or a section's key of that name (`seq_length`:
        dataset.seq_length, model.seq_length); else the closest by that last name."""
        keys = list(self.settings()) if self.settings else []
        named = [key for key in keys if key == word or key.endswith("." + word)]
        last = {key.rpartition(".")[2]: key for key in keys}
        return named or [last[close] for close in nearest(word, last)]

    def error(self, message: str):
        unknown = self.unknown_options()
        if message.startswith("unrecognized arguments:"):
            hints = [f"{name}: did you mean {meant}?" for name, meant in unknown.items() if meant]
            message += f" ({'; '.join(hints)})" if hints else ""
        elif unknown and "expected one argument" not in message:  # `--stop --x`: --x was meant as the value
            message += "; unknown: " + ", ".join(f"{name} (did you mean {meant}?)" if meant else name
                                                 for name, meant in unknown.items())
        super().error(message)


def dotted_keys(mapping: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys of a nested mapping's leaves (a config's settings)."""
    keys = []
    for key, value in mapping.items():
        if isinstance(value, Mapping) and value:
            keys += dotted_keys(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


def run_settings() -> list[str]:
    """The dotted keys of conf/topr.yaml, the base of every run config: `train`'s, `plan`'s and
    `submit`'s settings. Read on a usage error alone."""
    from omegaconf import OmegaConf

    return dotted_keys(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "topr.yaml")))


def at_least_one(text: str) -> int:
    """An integer count of at least 1 (a batch size, rows per batch): 0 or a negative one is a
    usage error, not a `range()` that runs no batch and writes an empty output."""
    value = int(text)
    if value < 1:
        raise OptionValueError(f"must be at least 1; got {value}", key="option.below_1", where="OPTION")
    return value


def non_negative(text: str) -> int:
    """A saved iteration's number: a negative one named a directory like iter_-000001."""
    value = int(text)
    if value < 0:
        raise OptionValueError(f"must be at least 0; got {value}", key="option.below_0", where="OPTION")
    return value


def finite(text: str) -> float:
    """A finite number (a baseline): NaN passes every comparison, so `data validate` took it
    without a word."""
    value = float(text)
    if not math.isfinite(value):
        raise OptionValueError(f"must be a finite number; got {text}", key="option.not_finite", where="OPTION")
    return value


def positive_seconds(text: str) -> float:
    """A time limit in seconds above 0: 0, a negative or a non-finite one is a usage error, not
    a limit every check fails (after the model is built) or none meets."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise OptionValueError(f"must be a number of seconds above 0; got {text}", key="option.not_above_0",
                               where="OPTION")
    return value


def share(text: str) -> float:
    """A share in [0, 1] (a rate, a fraction of samples): another value is a usage error. A
    negative one failed every run after its sampling, NaN compared false and never failed."""
    value = float(text)
    if not 0 <= value <= 1:
        raise OptionValueError(f"must be a share in [0, 1]; got {text}", key="option.not_a_share", where="OPTION")
    return value


def documented(doc: str) -> dict[str, Any]:
    """ArgumentParser keywords for a verb whose module docstring is its help: the first paragraph as
    the description, the rest as the epilog (the whole docstring there printed that paragraph twice)."""
    description, _, rest = doc.partition("\n\n")
    return {"description": description, "epilog": rest or None, "formatter_class": argparse.RawDescriptionHelpFormatter}
