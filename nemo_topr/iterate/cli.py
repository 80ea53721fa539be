"""`nemo-topr iterate CONFIG`: rounds of generate -> curate -> score mu -> train -> export -> eval.

    nemo-topr iterate conf/iterate_tiny_cpu.yaml base_model=DIR out=runs/iterate [rounds=3] [--dry-run]

Round r works in OUT/round_r/ and starts from round r-1's Megatron checkpoint (round 0 from
`base_model`: a Hugging Face directory, a Megatron checkpoint or a run, as `nemo-topr train`
takes it): `score` and `train` read that checkpoint directly, weights only (fresh optimizer,
iteration count and data order), so nothing is converted between rounds. Each round is still
exported to Hugging Face (OUT/round_r/model) for `eval` and for the next round's `generate`,
which sample with transformers; a Megatron base model is exported once too, to OUT/start/model.
OUT must be new, empty or an earlier `iterate`'s (its `.nemo-topr-output` mark): nothing in it is
deleted, but a stage that is rerun replaces its outputs (it runs with --overwrite).
The starting model is evaluated too, in OUT/start/. Each stage runs the
user-facing `nemo-topr` command in a subprocess (`generate` samples and grades in one command).
A stage that succeeds leaves a done-marker, STAGE.done.json, holding its arguments, outputs and
duration; a rerun skips marked stages, so an interrupted run resumes where it stopped (a failed
stage leaves no marker, and `train` itself resumes from its checkpoints). A marked stage whose
arguments have since changed is an error: its outputs fed the later stages. `--dry-run` lists
every stage as done or to run, and runs nothing.

Each run ends with OUT/summary.md and OUT/summary.json (per round: samples by grade, training
records, p and p~, pass@1, maj@k, invalid rate) and OUT/rounds.png (`nemo-topr eval --plot`).
With `verifier.model`, each evaluation's samples are scored by that verifier (`verifier score`)
and evaluated again (`eval --records`), adding the verifier-weighted vote, weighted_maj@k.

CONFIG is a driver config (`IterateConfig`, plain YAML, a path or a name in conf/), not a
training config: it names the training config (`train.config_name`) and holds each stage's
options; `key=value` arguments override it. Its `device` (cuda, or cpu as in iterate_tiny_cpu)
goes to every stage: `--device` of generate, score-logprobs, export and eval, `device=` of train.
Its `nproc_per_node` (default 1) runs score-logprobs and train under torchrun on this node; with
`nodes=N` (N > 1, the driver inside a Slurm allocation of N nodes) they run under srun across the
allocation instead, `nproc_per_node` ranks on each node (slurm/task.sh, as training jobs start).
"""

from __future__ import annotations

from nemo_topr.iterate.config import driver_settings
from nemo_topr.iterate.driver import Driver
from nemo_topr.iterate.validation import load_config
from nemo_topr.utils.arguments import Parser, documented


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="nemo-topr iterate", settings=driver_settings, **documented(__doc__))
    parser.add_argument("config", help="driver config: a YAML path, or a name in conf/ (e.g. iterate_tiny_cpu)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the driver config (dotted keys)")
    parser.add_argument("--dry-run", action="store_true", help="list the stages, done or to run; run nothing")
    args = parser.parse_intermixed_args(argv)  # --dry-run before or after the overrides
    Driver(load_config(args.config, args.overrides), dry_run=args.dry_run).run()
    return 0
