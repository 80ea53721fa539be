"""`nemo-topr submit`: check a TOPR job before it queues, render its sbatch script, submit it.

    nemo-topr submit --config llama31_70b_bf16 --account ACC --partition batch --nodes 4 \\
        --time 12:00:00 --container-image nvcr.io/nvidia/pytorch:25.09-py3 --dry-run \\
        base_model=/models/Llama-3.1-70B-Instruct dataset.train_path=/data/scored.jsonl

Pre-flight (always, and all of --dry-run's work besides printing): the run config composes; the
model directory holds config.json and a tokenizer; the training data exists; the run directory
can be created; the pre-emption warning comes before the time limit; the parallel layout fits
the GPU count (the checks of `nemo-topr plan`); the environment is named and exists -- a
container image, or a venv with bin/python. In container mode every path the run reads must lie
under a mount: --container-mounts SRC:DST[,...] is checked against them, and without it the
mounts are derived from the run config (checkout, run directory, base_model, the data's
directory). Relative paths in the run config are relative to the checkout, where the job runs.

The script is the same shape as slurm/*.sbatch: an #SBATCH header, the job's environment and
`exec slurm/topr_job.sh CONFIG overrides...`, which runs srun -> slurm/task.sh -> one rank per
GPU. Without --dry-run it is written to RUN_DIR/submit/JOB_NAME.sbatch and passed to `sbatch`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_topr.cluster.venv_check import check_venv
from nemo_topr.model import source as model_source
from nemo_topr.utils.arguments import CONF_DIR, Parser, at_least_one, run_settings
from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.preemption_warning import DEFAULT_WARNING_S, preset_warning_s
from nemo_topr.data.sources import HUB_PREFIX, why_missing
from nemo_topr.errors import UserError

REPO = Path(__file__).resolve().parents[2]


@dataclass
class ClusterJob:
    config_name: str
    overrides: list[str] = field(default_factory=list)
    job_name: str = "topr"
    run_dir: Path = REPO / "runs" / "topr"
    nodes: int = 1
    gpus_per_node: int = 8
    time: str = "04:00:00"
    account: str | None = None
    partition: str | None = None
    container_image: str | None = None
    container_mounts: str | None = None  # SRC:DST[,...]; None: derived from the run config
    venv: Path = REPO / ".venv"  # bare venv mode (no container image)
    preemption_warning_s: int = DEFAULT_WARNING_S

    def sbatch_script(self, mounts: str | None = None) -> str:
        header = {
            "job-name": self.job_name,
            "account": self.account,
            "partition": self.partition,
            "nodes": self.nodes,
            "ntasks-per-node": self.gpus_per_node,  # one task (training rank) per GPU
            "gpus-per-node": self.gpus_per_node,
            "exclusive": "",
            "time": self.time,
            # no `B:`: the signal goes to the ranks, which checkpoint (slurm/topr_job.sh)
            "signal": f"USR1@{self.preemption_warning_s}",
            "requeue": "",
            "output": f"{self.run_dir}/%x-%j.out",
            "open-mode": "append",  # a requeued job writes the same file: keep every start's log
        }
        lines = ["#!/usr/bin/env bash", f"# rendered by nemo-topr submit for config {self.config_name}"]
        lines += [f"#SBATCH --{key}" + (f"={sbatch_value(value)}" if value != "" else "")
                  for key, value in header.items() if value is not None]
        environment = {
            "NEMO_TOPR_ROOT": str(REPO),
            "NEMO_TOPR_RUN_DIR": str(self.run_dir),
            "NEMO_TOPR_GPUS_PER_NODE": str(self.gpus_per_node),
            "NEMO_TOPR_CONTAINER_IMAGE": self.container_image,
            "NEMO_TOPR_CONTAINER_MOUNTS": (mounts or self.container_mounts) if self.container_image else None,
            "NEMO_TOPR_VENV": None if self.container_image else str(self.venv),
        }
        lines += ["set -euo pipefail"]
        lines += [f"export {name}={shlex.quote(value)}" for name, value in environment.items() if value]
        command = [str(REPO / "slurm" / "topr_job.sh"), self.config_name, *self.overrides]
        lines += ["exec " + " ".join(shlex.quote(part) for part in command)]
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Pre-flight


@dataclass(frozen=True)
class Mount:
    source: Path  # on the host
    target: Path  # inside the container

    def host_path(self, path: Path) -> Path | None:
        """Where `path` (as the container sees it) is on the host, None if this mount misses it."""
        return self.source / path.relative_to(self.target) if path.is_relative_to(self.target) else None


def parse_mounts(spec: str) -> list[Mount]:
    """pyxis --container-mounts: SRC[:DST[:FLAGS]], comma-separated."""
    mounts = []
    for item in filter(None, spec.split(",")):
        source, _, rest = item.partition(":")
        target = rest.partition(":")[0] or source
        mounts.append(Mount(Path(source), Path(target)))
    return mounts


def settings_read(cfg: dict[str, Any]) -> dict[str, Any]:
    """The settings that name what the run opens, by config key (None where unset)."""
    named = {"run_dir": cfg.get("run_dir"), "base_model": cfg.get("base_model"),
             "dataset.train_path": (cfg.get("dataset") or {}).get("train_path")}
    return {key: None if value in ("", "???") else value for key, value in named.items()}


def paths_read(cfg: dict[str, Any]) -> dict[str, Path]:
    """Every path the run opens, by the config key that names it (relative: to the checkout)."""
    named = {"checkout": REPO}
    for key, value in settings_read(cfg).items():
        if value is not None and not str(value).startswith(HUB_PREFIX):  # a hub dataset: no path, no mount
            named[key] = REPO / Path(value)  # an absolute value replaces REPO
    if "base_model" in named:  # RUN@ITERATION reads the run directory
        named["base_model"] = Path(model_source.split_iteration(named["base_model"])[0])
    return named


def derived_mounts(paths: dict[str, Path]) -> str:
    """One same-path mount per directory the run needs (the data's own, or a data file's or pattern's
    directory), nested ones dropped."""
    directories = sorted({path.parent if key == "dataset.train_path" and not path.is_dir() else path
                          for key, path in paths.items()})
    kept = [d for d in directories if not any(d != other and d.is_relative_to(other) for other in directories)]
    return ",".join(f"{d}:{d}" for d in kept)


def check_environment(job: ClusterJob, paths: dict[str, Path],
                      mounts: list[Mount]) -> tuple[list[UserError], dict[str, Path]]:
    """(problems, each read path as the submit host sees it)."""
    problems = []
    if not job.container_image:
        if not (job.venv / "bin" / "python").is_file():
            problems.append(UserError(f"no container image and no venv: {job.venv}/bin/python does not exist "
                                      "(pass --container-image IMAGE or --venv DIR)", key="--venv.no_python",
                                      where="--venv"))
        return problems, paths
    for mount in mounts:  # slurm/topr_job.sh creates the run directory before srun mounts it
        if not mount.source.exists() and not mount.source.is_relative_to(job.run_dir):
            problems.append(UserError(f"--container-mounts source {mount.source} does not exist",
                                      key="--container-mounts.source_missing", where="--container-mounts"))
    on_host = {}
    for key, path in paths.items():
        found = next((host for mount in mounts if (host := mount.host_path(path)) is not None), None)
        if found is None:
            problems.append(UserError(f"{key}={path} is not under any container mount "
                                      f"({', '.join(str(m.target) for m in mounts) or 'none'})",
                                      key=f"{key}.not_mounted", where=key))
        else:
            on_host[key] = found
    return problems, on_host


def read_from_the_checkout(typed: Any) -> str:
    """Why a relative path missing from the checkout is missing, where it exists in the working
    directory: `train` reads it there, `submit` from the checkout, where the job runs."""
    path = Path(model_source.split_iteration(str(typed))[0])
    if path.is_absolute() or Path.cwd().resolve() == REPO or not (Path.cwd() / path).exists():
        return ""
    return (f" (a relative path is read from the checkout, {REPO}, where the job runs; "
            f"{Path.cwd() / path} exists: give that)")


def check_inputs(on_host: dict[str, Path], cfg: dict[str, Any]) -> list[UserError]:
    """The starting model is complete (`nemo_topr.model.source`: an HF directory with config and
    tokenizer, or a finished Megatron checkpoint carrying its HF config), the data exists and the
    run directory can be created and is no model. `on_host`: the paths as the submit host sees
    them; `cfg`'s values as the user wrote them name them in the errors."""
    from nemo_topr.utils.outputs import nearest_existing
    from nemo_topr.training.validation import check_run_dir

    problems = []
    typed = settings_read(cfg)
    model = on_host.get("base_model")
    if model is not None:
        try:
            model_source.resolve(f"{model}{model_source.split_iteration(str(typed['base_model']))[1]}")
        except model_source.ModelSourceError as error:
            problems.append(UserError(f"{error}{read_from_the_checkout(typed['base_model'])}",
                                      key="base_model.not_a_model", where="base_model"))
    data = on_host.get("dataset.train_path")
    if data is not None and (missing := why_missing(str(data), typed=str(typed["dataset.train_path"]))):
        problems.append(UserError(f"dataset.train_path={data}: {missing}"
                                  f"{read_from_the_checkout(typed['dataset.train_path'])}",
                                  key="dataset.train_path.missing", where="dataset.train_path"))
    run_dir = on_host.get("run_dir")
    if run_dir is not None:
        existing = nearest_existing(run_dir)
        if not (existing.is_dir() and os.access(existing, os.W_OK)):
            problems.append(UserError(f"run_dir={run_dir} cannot be created: {existing} is not a writable directory",
                                      key="run_dir.not_creatable", where="run_dir"))
        try:
            check_run_dir(run_dir)  # train's own refusal, before the job script is written into it
        except ConfigError as error:
            problems.append(UserError(str(error), key="run_dir.refused_by_train", where="run_dir"))
    return problems


def time_limit_seconds(limit: str) -> int:
    """sbatch --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (sbatch(1))."""
    days, _, clock = limit.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    if days:  # after "D-" the clock starts with hours
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:
        hours, minutes, seconds = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def check_time(job: ClusterJob) -> list[UserError]:
    try:
        limit = time_limit_seconds(job.time)
    except (ValueError, KeyError):
        return [UserError(f"--time {job.time!r} is not a Slurm time (MM, HH:MM:SS, D-HH:MM:SS, ...)",
                          key="--time.not_a_slurm_time", where="--time")]
    if job.preemption_warning_s >= limit:
        return [UserError(f"--preemption-warning {job.preemption_warning_s} s is not shorter than --time {job.time} "
                          f"({limit} s): the ranks would be told to stop as soon as they start",
                          key="--preemption-warning.not_below_time", where="--preemption-warning")]
    return []


def check_sbatch_words(job: ClusterJob) -> list[UserError]:
    """The job name and run directory go into #SBATCH lines, where a value with whitespace is
    double-quoted (`sbatch_value`); one holding a double quote or a line break cannot be written."""
    return [UserError(f"{option} {value!r}: an #SBATCH line cannot hold a double quote or a line break; choose one "
                      "without", key=f"{option}.not_an_sbatch_word", where=option)
            for option, value in (("--job-name", job.job_name), ("--run-dir", str(job.run_dir)))
            if '"' in value or "\n" in value or "\r" in value]


# A file name holds 255 bytes (NAME_MAX); Slurm's log adds "-JOBID.out", a job id of up to 10 digits.
MAX_JOB_NAME_BYTES = 255 - len("-4294967295.out")


def job_name_problem(job_name: str) -> str | None:
    """Why `job_name` cannot name the job's files, RUN_DIR/submit/NAME.sbatch and Slurm's log
    RUN_DIR/NAME-JOBID.out (`../../x` wrote the script outside the run directory); None if it can."""
    why = ("is empty" if not job_name else "holds a '/'" if "/" in job_name
           else "is not a file name" if job_name in (".", "..")
           else "starts with '-', as an option does" if job_name[0] == "-"
           else f"is {size} bytes, over the {MAX_JOB_NAME_BYTES} that leave the log's -JOBID.out room in a file name"
           if (size := len(job_name.encode())) > MAX_JOB_NAME_BYTES
           else None)
    return why and (f"--job-name {job_name!r} {why}: it names the job's script RUN_DIR/submit/NAME.sbatch and "
                    "Slurm's log RUN_DIR/NAME-JOBID.out; choose a plain file name")


def sbatch_value(value: object) -> str:
    """A value as an #SBATCH line holds it: sbatch reads an unquoted one up to the first blank and
    refuses the rest ("Invalid directive found in batch script: b" for `--job-name=a b`, Slurm
    22.05, tried), and reads a double-quoted one whole."""
    text = str(value)
    return f'"{text}"' if any(c.isspace() for c in text) else text


def check_layout(cfg: dict[str, Any], title: str, job: ClusterJob) -> tuple[list[UserError], list[str]]:
    """`nemo-topr plan`'s layout rules for this node count: (problems, warnings)."""
    from nemo_topr.cluster import checks
    from nemo_topr.cluster.layout import layout_from_config
    from nemo_topr.cluster.plan import resolve_architecture

    arch, _ = resolve_architecture(cfg, title, None)
    findings = checks.check_layout(arch, layout_from_config(cfg, job.nodes, job.gpus_per_node))
    problems = [UserError(f"layout: {f.rule}: {f.explained}", key="layout.rule_broken", where=f.rule)
                for f in findings if f.blocking]
    warnings = [f"layout: {f.rule}: {f.detail}" for f in findings if not f.passed and not f.blocking]
    return problems, warnings


def check_settings_set(cfg: dict[str, Any]) -> list[UserError]:
    """The settings that name what the run opens and are unset: the job could open nothing."""
    return [UserError(f"{key} is not set", key=f"{key}.not_set", where=key)
            for key, value in settings_read(cfg).items() if value is None]


def preflight(job: ClusterJob) -> tuple[list[UserError], list[str], str | None]:
    """(problems, warnings, container mounts) for `job`; the job may be queued when problems is empty."""
    from nemo_topr.cluster.plan import compose_config

    try:
        # as slurm/topr_job.sh passes them to every rank
        cfg, title = compose_config(job.config_name, [f"run_dir={job.run_dir}", *job.overrides], None)
    except ConfigError as error:
        return [UserError(f"run config: {error}", key="run_config.refused", where="--config")], [], None
    paths = paths_read(cfg)
    if Path(job.config_name).is_absolute():  # a user's YAML: the ranks read it (and whatever is beside it)
        paths["--config"] = Path(job.config_name).parent
    problems = check_settings_set(cfg)
    problems += check_time(job) + check_sbatch_words(job)
    mounts = (job.container_mounts or derived_mounts(paths)) if job.container_image else None
    environment_problems, on_host = check_environment(job, paths, parse_mounts(mounts or ""))
    input_problems = check_inputs(on_host, cfg)
    problems += environment_problems + input_problems
    warnings: list[str] = []
    if not job.container_image and not environment_problems:
        venv_problems, warnings = check_venv(job.venv, cfg)
        problems += venv_problems
    if "base_model" in on_host and not input_problems:
        host_spec = f"{on_host['base_model']}{model_source.split_iteration(cfg['base_model'])[1]}"
        layout_problems, layout_warnings = check_layout({**cfg, "base_model": host_spec}, title, job)
        problems += layout_problems
        warnings += layout_warnings
        if "run_dir" in on_host:
            seen_as = (on_host["base_model"], paths["base_model"]) if job.container_image else None
            resume_problems, resume_warnings = check_run_it_resumes(cfg, host_spec, on_host["run_dir"], seen_as)
            problems += resume_problems
            warnings += resume_warnings
    return problems, warnings, mounts


def check_run_it_resumes(cfg: dict[str, Any], host_spec: str, run_dir: Path,
                 seen_as: tuple[Path, Path] | None) -> tuple[list[UserError], list[str]]:
    """A job for a run directory that holds a run resumes it: say so, and refuse now, not after
    the queue wait, what `nemo-topr train` would refuse at its start (another objective, base
    model, lr, ...; a finished run). The base model is compared as the job will name it: in a
    container, `seen_as` = (its directory on this host, the same in the container)."""
    from omegaconf import OmegaConf

    from nemo_topr.training.run_state import RunStateError, check_queued_start, resume_settings
    from nemo_topr.training.validation import objective_from

    settings = resume_settings(OmegaConf.create(cfg), objective_from(cfg.get("objective") or {}),
                               model_source.resolve(host_spec))
    if seen_as is not None:  # the loaded directory (a run's iteration) is the given one or inside it
        host_dir, job_dir = seen_as
        settings["base_model"] = str(job_dir / Path(settings["base_model"]).relative_to(host_dir.resolve()))
    try:
        iteration = check_queued_start(run_dir, settings)
    except RunStateError as error:
        return [UserError(str(error), key="run_dir.resume_refused", where="run_dir")], []
    if iteration is None:
        return [], []
    return [], [f"run_dir={run_dir} holds a run with a checkpoint at iteration {iteration}: this job resumes it (its "
                "data is compared with the run's when it starts); for a new run, choose another --run-dir or "
                "--job-name"]


def submit(job: ClusterJob, script_text: str) -> str:
    """Write the script under the run directory, run `sbatch` on it, return sbatch's answer. The
    script of an earlier submit of the same job name is replaced: it is this command's own."""
    script = job.run_dir / "submit" / f"{job.job_name}.sbatch"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(script_text)
    script.chmod(0o755)
    answer = subprocess.run(["sbatch", str(script)], capture_output=True, text=True)
    if answer.returncode != 0:
        raise UserError(f"sbatch {script} failed (exit {answer.returncode}): {answer.stderr.strip()}",
                        key="sbatch.failed", where=str(script))
    return answer.stdout.strip()


def job_run_dir(run_dir_option: Path | None, overrides: list[str]) -> tuple[Path | None, list[str]]:
    """The job's run directory and the overrides without `run_dir=`: --run-dir (from where submit
    runs), else a `run_dir=` override (from the checkout, where the job reads it), else None (see
    `own_run_dir`). The job script keeps its logs, its script and the requeue marker there and
    passes it to train; a `run_dir=` naming another directory would have train write there, where
    the script never looks for the marker (a pre-empted job not requeued), so both, apart, are
    an error."""
    named = {override: override.split("=", 1)[1] for override in overrides
             if override.split("=", 1)[0].lstrip("+") == "run_dir"}
    rest = [override for override in overrides if override not in named]
    if "" in named.values():  # REPO / "" is the checkout itself
        raise UserError("run_dir= is empty: give the run directory (or --run-dir)", key="run_dir.empty",
                        where="run_dir")
    from_override = {(REPO / value).resolve() for value in named.values()}
    if len(from_override) > 1:
        raise UserError(f"{' and '.join(named)} name two run directories: give one", key="run_dir.twice",
                        where="run_dir")
    if run_dir_option is None:
        return (from_override.pop() if from_override else None), rest
    run_dir = run_dir_option.resolve()
    if from_override and from_override != {run_dir}:
        raise UserError(f"--run-dir {run_dir_option} and {next(iter(named))} name different run "
                         "directories: the job keeps its logs and requeue marker in --run-dir and train would "
                         "write into the other; give one of them", key="run_dir.differs_from_option", where="--run-dir")
    return run_dir, rest


def own_run_dir(config_file: Path, overrides: list[str]) -> Path | None:
    """The run directory a user's YAML file sets itself (from the checkout, as the job reads it), as
    train would compose it; None when the file sets none (its presets' `runs/NAME` is no choice of
    the user's) or does not parse (pre-flight then says so and queues nothing)."""
    import yaml

    from nemo_topr.cluster.plan import compose_config

    try:
        own = yaml.safe_load(config_file.read_text())
    except yaml.YAMLError:
        return None
    if not (isinstance(own, dict) and own.get("run_dir") is not None):
        return None
    try:
        return (REPO / compose_config(str(config_file), overrides, None)[0]["run_dir"]).resolve()
    except ConfigError as error:  # not replaced by runs/JOB_NAME, which would hide it from pre-flight
        raise ConfigError(f"not queued: run config: {error}", key="config.refused", where="--config") from None


def main(argv: list[str]) -> int:
    parser = Parser(prog="nemo-topr submit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                    settings=run_settings)
    # --config-name as `train` spells it (`plan` takes either, or the config as its first word)
    parser.add_argument("--config", "--config-name", dest="config", required=True,
                        help="a config in conf/ (e.g. llama31_8b_bf16), or the path of your own YAML file, whose "
                             "defaults may name those")
    parser.add_argument("--job-name", help="names RUN_DIR/submit/JOB_NAME.sbatch and the log, so no '/' and no "
                                            "leading '-' (default: topr-CONFIG, the YAML file's name without .yaml)")
    parser.add_argument("--run-dir", type=Path, help="default: a run_dir= override, else the run_dir your own "
                                                     "YAML sets (both from the checkout), else runs/JOB_NAME")
    parser.add_argument("--nodes", type=at_least_one, default=1)
    parser.add_argument("--gpus-per-node", type=at_least_one, default=8)
    parser.add_argument("--time", default="04:00:00")
    parser.add_argument("--account")
    parser.add_argument("--partition")
    parser.add_argument("--container-image", help="pyxis/enroot image; omit for a bare venv (--venv)")
    parser.add_argument("--container-mounts", help="pyxis SRC:DST[,...] (default: derived from the run config)")
    parser.add_argument("--venv", type=Path, default=REPO / ".venv",
                        help="bare venv mode: the virtual environment on the nodes (default: %(default)s)")
    parser.add_argument("--preemption-warning", type=at_least_one, dest="preemption_warning_s",
                        help="seconds before the time limit at which the ranks checkpoint and the job requeues "
                             "(default: that of the preset's slurm/*.sbatch script, else 600)")
    parser.add_argument("--dry-run", action="store_true", help="check and print the sbatch script; queue nothing")
    parser.add_argument("overrides", nargs="*", help="key=value overrides passed to nemo-topr train")
    args = parser.parse_intermixed_args(argv)  # options before, between or after the overrides
    # torch, then Bridge's config classes, take seconds to import: say what is under way first
    print(f"nemo-topr submit: checking the job of {args.config} as train would", file=sys.stderr, flush=True)
    from nemo_topr.training.config import config_location

    config_dir, name = config_location(args.config)
    # a preset by its name, a YAML file elsewhere by its absolute path: the job runs train from the checkout
    config = name if config_dir == CONF_DIR.resolve() else str(config_dir / f"{name}.yaml")
    job_name = f"topr-{name}" if args.job_name is None else args.job_name  # `--job-name ""` is refused
    if problem := job_name_problem(job_name):  # before it names a default run directory, runs/JOB_NAME
        raise UserError(problem, key="--job-name.not_a_file_name", where="--job-name")
    run_dir, overrides = job_run_dir(args.run_dir, args.overrides)
    if run_dir is None and config_dir != CONF_DIR.resolve():
        run_dir = own_run_dir(config_dir / f"{name}.yaml", overrides)
    run_dir = run_dir or (REPO / "runs" / job_name).resolve()
    job = ClusterJob(config_name=config, overrides=overrides, job_name=job_name, run_dir=run_dir, nodes=args.nodes,
                     gpus_per_node=args.gpus_per_node, time=args.time, account=args.account,
                     partition=args.partition, container_image=args.container_image,
                     container_mounts=args.container_mounts, venv=args.venv.resolve(),
                     preemption_warning_s=args.preemption_warning_s or preset_warning_s(
                         config_dir / f"{name}.yaml", CONF_DIR.resolve()))
    problems, warnings, mounts = preflight(job)
    for warning in warnings:
        print(f"nemo-topr submit: warning: {warning}", file=sys.stderr)
    if problems:
        print("nemo-topr submit: not queued, the job would fail:", file=sys.stderr)
        print("\n".join(f"  - {problem}" for problem in problems), file=sys.stderr)
        return 1
    script = job.sbatch_script(mounts)
    if args.dry_run:
        sys.stdout.write(script)
    else:
        print(submit(job, script))
    return 0
