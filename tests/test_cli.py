"""nemo_topr/cli.py: the verb dispatch, --version and a misspelled verb."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest
from tests.conftest import REPO, checkout_env, placeholder_hf_model
from nemo_topr.cli import main


def _pins() -> dict[str, str]:
    """name -> version pinned in the requirements `make venv` installs."""
    text = "".join((REPO / name).read_text() for name in ("requirements.txt", "requirements-nodeps.txt"))
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.MULTILINE))


def test_version_names_nemo_topr_and_the_installed_stack(capsys):
    """What a bug report needs first; it was `unknown verb '--version'`."""
    assert main(["--version"]) == 0
    pins, version = _pins(), re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)[1]
    te = "not installed" if importlib.util.find_spec("transformer_engine") is None else r"\d+\.\d+\S*"
    assert re.fullmatch(
        rf"nemo-topr {re.escape(version)} \(megatron-bridge {re.escape(pins['megatron-bridge'])}, megatron-core "
        rf"{re.escape(pins['megatron-core'])}, torch {re.escape(pins['torch'])}, transformer-engine {te}\)\n",
        capsys.readouterr().out)


def test_a_misspelled_or_shortened_verb_is_named_with_the_verb_meant(capsys):
    for typed, meant in (("trian", "train"), ("score", "score-logprobs"), ("exprot", "export")):
        assert main([typed]) == 2
        assert capsys.readouterr().err.startswith(f"nemo-topr: unknown verb {typed!r}; did you mean {meant}?\n")
    assert main(["xyz"]) == 2
    assert capsys.readouterr().err.startswith("nemo-topr: unknown verb 'xyz'\n\nusage: nemo-topr")


def test_ctrl_c_stops_a_verb_in_one_line_with_the_shells_status(monkeypatch, capsys):
    """Ctrl-C in `score-logprobs` (or any verb but train, which saves and exits 75) printed a
    KeyboardInterrupt traceback; 130 is 128 + SIGINT, as a shell reports a command it stopped."""
    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr("nemo_topr.data.cli.main", interrupted)
    assert main(["data", "validate", "graded.jsonl"]) == 130
    assert capsys.readouterr().err == "nemo-topr data: interrupted\n"


@pytest.mark.parametrize("argv", [["--verbose", "data", "validate", "graded.jsonl"],
                                  ["data", "validate", "graded.jsonl", "--verbose"],
                                  ["data", "--verbose", "validate", "graded.jsonl"]])
def test_verbose_is_read_before_or_after_the_verb(argv, monkeypatch):
    """`nemo-topr export ... --verbose`, as the README's "`--verbose` shows them" invites, ended in
    "unrecognized arguments: --verbose" (found by following the docs)."""
    from nemo_topr.model.quiet import VERBOSE_ENV

    received = []
    monkeypatch.setattr("nemo_topr.data.cli.main", received.append)
    # setenv records the variable's absence, so the "1" that main sets is undone after the test (delenv of an
    # unset variable records nothing: the worker's later subprocesses all ran verbose)
    monkeypatch.setenv(VERBOSE_ENV, "0")
    assert main(argv) == 0
    assert received == [["validate", "graded.jsonl"]]
    assert os.environ[VERBOSE_ENV] == "1"


def test_no_verbs_help_says_a_line_twice(capsys):
    """`eval`, `verifier` and `iterate` printed their docstring's first paragraph as the description
    and again at the top of the epilog (the whole docstring)."""
    import contextlib

    from nemo_topr.cli import VERBS

    for verb in VERBS:
        with contextlib.suppress(SystemExit):
            main([verb, "--help"])
        lines = [line.strip() for line in capsys.readouterr().out.splitlines() if len(line.strip()) > 40]
        assert lines and len(lines) == len(set(lines)), (verb, [line for line in lines if lines.count(line) > 1])


SCORED = REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl"
HEAVY_IMPORT = re.compile(r"^import time:.*\|\s+(torch|transformers|megatron)\b")


@pytest.mark.slow  # four subprocesses importing torch, transformers or Bridge
@pytest.mark.parametrize("verb, args", [
    ("data validate", [str(SCORED), "--tokenizer", "MODEL"]),
    ("data stats", [str(SCORED)]),
    ("plan", ["llama31_8b_bf16"]),
    ("submit", ["--config", "llama31_8b_bf16", "--dry-run"]),
])
def test_a_verb_that_loads_for_seconds_says_so_before_the_imports(verb, args, tmp_path):
    """Loading torch, transformers or Megatron takes these verbs 5 to 13 s: a line of their own
    comes before the first of those imports (Python's -X importtime reports each import
    as it ends, on the same unbuffered stream)."""
    model = str(placeholder_hf_model(tmp_path / "model"))
    command = [sys.executable, "-u", "-X", "importtime", "-m", "nemo_topr.cli", *verb.split(),
               *[model if arg == "MODEL" else arg for arg in args]]
    lines = subprocess.run(command, cwd=tmp_path, env=checkout_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=300).stdout.splitlines()
    heavy = next(index for index, line in enumerate(lines) if HEAVY_IMPORT.match(line))
    said = [line for line in lines[:heavy] if line.startswith(f"nemo-topr {verb}: ")]
    assert said, lines[:heavy][-5:]


def test_score_logprobs_says_what_seq_length_is_and_its_default(capsys):
    """`--seq-length SEQ_LENGTH` has help that says its default."""
    with pytest.raises(SystemExit):
        main(["score-logprobs", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    entry = help_text.rsplit("--seq-length SEQ_LENGTH", 1)[1].split(" --", 1)[0]  # the options list, not usage
    assert "2048" in entry and len(entry.split()) > 3, entry
