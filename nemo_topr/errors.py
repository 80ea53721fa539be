"""The one root of the errors a user can act on, and the one "did you mean" helper.

A refusal says what is wrong, where (a file:row:field, a config key or an option) and, where it is
not obvious, what to do. Every refusal raises `UserError` or a subclass; `nemo_topr.cli.main`
renders it as one line, ``nemo-topr VERB: MESSAGE``, with the error's `exit_code` (1 unless a
subclass says otherwise). Verbs never catch user errors to print them: an error met deep in a
verb reaches the user unchanged.

`key` names the problem for tests and tools (``"optimizer.lr.below_min_lr"``); the message is for
people and may be reworded without touching a test that asserts the key.
"""

from __future__ import annotations

import contextlib
import difflib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence


class UserError(Exception):
    """A problem the user can fix: bad input, a setting that cannot work, a full disk."""

    exit_code: int = 1

    def __init__(self, message: str, *, key: str | None = None, where: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.where = where


class Problems(list):
    """What a verb's `validate` finds: `check()` is a block whose error (a `caught`) is kept, and the
    checks after it still run. A problem two checks share (`--limit 0`, refused by the sampling options
    and by the prompts) is kept once."""

    caught: type[UserError] = UserError

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except self.caught as found:
            if not any((kept.key, kept.where, str(kept)) == (found.key, found.where, str(found)) for kept in self):
                self.append(found)


def refuse(problems: Sequence[UserError], *, key: str = "several_problems", separator: str = "\n") -> None:
    """Raise what a verb's `validate` found: the one problem itself, or one error of the first problem's
    class (so its callers' catch and its exit code hold) naming them all, each in turn after `separator`,
    with `key` and every problem's where joined by ", ". Nothing found: return."""
    if len(problems) == 1:
        raise problems[0]
    if problems:
        # made as a UserError: a subclass's own __init__ (DataError's path, line, field) builds one problem's words
        several = type(problems[0]).__new__(type(problems[0]))
        UserError.__init__(several, separator.join(str(problem) for problem in problems), key=key,
                           where=", ".join(str(problem.where) for problem in problems))
        raise several


def run_refusing(name: str, main: Callable[[list[str]], int | None], argv: list[str]) -> int:
    """`main(argv)`'s exit code, a `UserError` printed as one line ``NAME: MESSAGE`` on stderr with its
    `exit_code`: how `nemo_topr.cli.main` and the ``python -m`` entry points that bypass it end a refusal."""
    try:
        return int(main(argv) or 0)
    except UserError as error:
        print(f"{name}: {error}", file=sys.stderr)
        return error.exit_code


def nearest(word: str, choices: Iterable[str], *, n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The choices closest to a mistyped `word`, best first (difflib's ratio, at least `cutoff`)."""
    return difflib.get_close_matches(word, list(choices), n=n, cutoff=cutoff)


def suggestion(names: Sequence[str], *, joiner: str = " or ") -> str:
    """``"; did you mean X?"`` naming suggestions already chosen (joined by `joiner`), ``""`` for none."""
    return f"; did you mean {joiner.join(names)}?" if names else ""


def did_you_mean(word: str, choices: Iterable[str], *, n: int = 1, cutoff: float = 0.6, quote: bool = False,
                 prefix: str = "") -> str:
    """`suggestion` of the choices nearest `word` (``X or Y`` when n > 1), or ``""`` when none is near.

    `prefix` is put before each suggestion (a section's ``"optimizer."``); `quote` writes them as reprs.
    """
    close = nearest(word, choices, n=n, cutoff=cutoff)
    return suggestion([repr(prefix + name) if quote else prefix + name for name in close])
