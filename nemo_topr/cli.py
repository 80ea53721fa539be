"""`nemo-topr` command line: one verb per stage of the recipe.

Each verb lives in its own module exposing ``main(argv) -> int``; modules are imported only
when their verb runs, so `nemo-topr data stats` never pays for importing Megatron.
"""

from __future__ import annotations

import importlib
import os
import sys

from nemo_topr import __version__, installed_version
from nemo_topr.errors import nearest, run_refusing, suggestion
from nemo_topr.training.preemption_warning import hold_the_warning
from nemo_topr.model.quiet import VERBOSE_ENV, quiet_known_noise

# verb -> (module, one-line help). Keep in pipeline order.
VERBS: dict[str, tuple[str, str]] = {
    "data": ("nemo_topr.data.cli", "validate, inspect and curate pre-scored datasets"),
    "generate": ("nemo_topr.evaluation.generate", "sample and grade completions into pre-scored records"),
    "import": ("nemo_topr.training.import_checkpoint", "convert a Hugging Face model once to a Megatron checkpoint"),
    "score-logprobs": ("nemo_topr.training.scoring", "add behaviour log-probs log mu(y|x) to a dataset"),
    "train": ("nemo_topr.training.recipe", "TOPR training on Megatron-Bridge's finetune() loop"),
    "export": ("nemo_topr.training.export", "write a run's checkpoints (latest, or chosen iterations) as Hugging Face models"),
    "eval": ("nemo_topr.evaluation.evaluate", "pass@k, maj@k and invalid rate on GSM8K / MATH-500; round plots"),
    "plan": ("nemo_topr.cluster.plan", "pre-flight check of a parallel layout and per-GPU memory"),
    "submit": ("nemo_topr.cluster.submit", "render and submit a Slurm job for a TOPR run"),
    "verifier": ("nemo_topr.evaluation.verifier", "generative verifier: Yes/No judge data, P(Yes) for weighted votes"),
    "iterate": ("nemo_topr.iterate.cli", "rounds of generate -> curate -> score mu -> train -> export -> eval"),
    "doctor": ("nemo_topr.doctor.command", "check a new node end to end: score, train, resume, export, versions"),
}
# (verb, sub-verb) -> module: a sub-verb whose work sits above its verb's layer. `data prepare`
# reads a training config; `nemo-topr data --help` lists it with the data verb's others.
SUB_VERBS: dict[tuple[str, str], str] = {("data", "prepare"): "nemo_topr.training.prepare"}
# verbs whose refusals name the sub-verb too (`nemo-topr data validate: ...`); a sub-verb is the
# verb's first word, argparse's subparsers refuse any other
NAMED_WITH_SUB_VERB = {"data"}


def _usage() -> str:
    width = max((len(v) for v in VERBS), default=0)
    lines = ["usage: nemo-topr [--verbose] VERB [args...]", "       nemo-topr --version", "", "verbs:"]
    lines += [f"  {verb:<{width}}  {help_}" for verb, (_, help_) in VERBS.items()]
    lines += ["", "Run `nemo-topr VERB --help` for a verb's options. --verbose (or NEMO_TOPR_VERBOSE=1) shows the "
              "start-up warnings known to be harmless (nemo_topr/model/quiet.py)."]
    return "\n".join(lines)


def _version() -> str:
    """nemo-topr's version and the installed stack's, from package metadata (nothing imported)."""
    stack = ("megatron-bridge", "megatron-core", "torch", "transformer-engine")
    return (f"nemo-topr {__version__} ("
            + ", ".join(f"{name} {installed_version(name) or 'not installed'}" for name in stack) + ")")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # every warning and log line, the known-harmless ones included; before or after the verb
    # (`nemo-topr train ... --verbose`, as often written): no verb has an option of that name
    if "--verbose" in argv:
        os.environ[VERBOSE_ENV] = "1"
        argv = [arg for arg in argv if arg != "--verbose"]
    quiet_known_noise()
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":  # what a bug report needs first
        print(_version())
        return 0
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        close = [name for name in VERBS if name.startswith(verb)] or nearest(verb, VERBS)
        print(f"nemo-topr: unknown verb {verb!r}{suggestion(close[:1])}\n\n{_usage()}",
              file=sys.stderr)
        return 2
    if verb == "train":
        # Slurm's pre-emption warning (SIGUSR1, slurm/topr_job.sh) may come while the rank still
        # imports Megatron; its default action would kill the rank and fail the job. Keep it
        # pending from here on: train() hands it to Bridge's handler, which saves and requeues.
        hold_the_warning()
    # every refusal, in one line, whichever layer of the verb met it; `data`'s name its sub-verb's too
    name = f"nemo-topr {verb} {rest[0]}" if verb in NAMED_WITH_SUB_VERB and rest else f"nemo-topr {verb}"
    module = VERBS[verb][0]
    if rest and (verb, rest[0]) in SUB_VERBS:
        module, rest = SUB_VERBS[verb, rest[0]], rest[1:]
    try:
        return run_refusing(name, importlib.import_module(module).main, rest)
    except KeyboardInterrupt:  # Ctrl-C is the user's own stop, not a failure to show a traceback of
        print(f"nemo-topr {verb}: interrupted", file=sys.stderr)
        return 130  # the shell's status for a command stopped by SIGINT


if __name__ == "__main__":
    sys.exit(main())
