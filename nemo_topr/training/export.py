"""`nemo-topr export`: Megatron checkpoints -> Hugging Face directories.

    nemo-topr export --ckpt runs/my_run --hf-out exports/my_model                 # latest checkpoint
    nemo-topr export --ckpt runs/my_run@200 --hf-out exports/my_model             # one iteration
    nemo-topr export --ckpt runs/my_run --hf-out exports/my_run --iteration 100 200
    nemo-topr export --ckpt runs/my_run --hf-out exports/my_run --all-iterations  # every saved one
    nemo-topr export --ckpt /ckpt/llama31_8b --hf-out exports/llama31_8b         # any Megatron checkpoint
    nemo-topr export --ckpt runs/tiny_cpu --hf-out exports/tiny --device cpu      # on a machine without CUDA
    nemo-topr export --ckpt runs/my_run --hf-out exports/my_model --overwrite     # replace an earlier export

--ckpt takes any Megatron checkpoint `base_model=` accepts (a run directory, RUN@ITERATION, a
checkpoint root or one iter_* directory) that carries its HF config in hf_artifacts/ (every
`nemo-topr train` run and `nemo-topr import` writes it). Weights go through Bridge's AutoBridge
(safetensors, that HF config); the tokenizer, chat template and generation config come from
hf_artifacts/ too, so the result loads with `transformers` as is. With several iterations each
goes to HF_OUT/iter_NNNNNNN; one process exports them all, so the ~10 s of Megatron start-up is
paid once (each further checkpoint of a small model takes well under 1 s).

An earlier export of the very same checkpoint, whose files and HF config, and its own files, are
unchanged since (by name, size and modification time), is kept and listed as `kept`: run again, an
export cut short (a job's time limit during --all-iterations) goes on where it stopped. Any other
non-empty output directory is refused unless --overwrite, which replaces only an earlier export (a
directory holding its nemo_topr_export.json: a typo could name the base model) and redoes kept
ones; the checkpoint being exported (or a directory holding it, or one inside its root), a path
below a file and one inside an earlier export are refused always. Each model is written beside its
target and moved into place once complete; one that fails to be written (a full disk) is removed
and named in one line. A second export into the same target while one writes it is refused. A line
on stderr tells how many checkpoints are exported, at most every 10 s; stdout lists them at the end.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nemo_topr.errors import Problems, UserError, refuse
from nemo_topr.utils.arguments import Parser, non_negative
from nemo_topr.model.device import add_device_argument, select_device, use_device
from nemo_topr.model.source import (MEGATRON_KINDS, ModelSource, ModelSourceError, check_intact, resolve,
                                    split_iteration)
from nemo_topr.utils.progress import Progress
from nemo_topr.model.quiet import stdout_to_stderr
from nemo_topr.training.checkpoints import iteration_dir_name


EXPORT_RECORD = "nemo_topr_export.json"  # in every export: what it was exported from
EXPORTED_KINDS = f"one of: {MEGATRON_KINDS}"  # what --ckpt takes: a Hugging Face directory has nothing to export


class ExportWriteError(UserError, RuntimeError):
    """An export that could not be written (no space left, an I/O error); its partial directory is removed."""


def _safetensors_error() -> type[Exception]:
    """What safetensors raises for an I/O error while writing a shard ("No space left on device
    (os error 28)" on a full disk): not an OSError."""
    from safetensors import SafetensorError

    return SafetensorError


def export_targets(source: ModelSource, hf_out: Path, iterations: list[int] | None) -> dict[ModelSource, Path]:
    """{checkpoint: HF directory}: `source` itself to HF_OUT (iterations None), or each given
    iteration to HF_OUT/iter_NNNNNNN."""
    if not source.is_megatron:
        raise ModelSourceError(f"{source.path}: already a Hugging Face directory; export reads Megatron checkpoints",
                               key="export.ckpt.hugging_face", where="--ckpt")
    if iterations is None:
        return {source: hf_out}
    return {source.at_iteration(i): hf_out / iteration_dir_name(i) for i in iterations}


def files_stamp(*directories: Path) -> str:
    """A digest of the names, sizes and modification times of the files under `directories`, an
    export's record left out: what was made from them, or they themselves, are current while it is
    unchanged, as make judges."""
    digest = hashlib.sha256()
    for directory in directories:
        for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != EXPORT_RECORD):
            stat = path.stat()
            digest.update(f"{path.relative_to(directory)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def checkpoint_stamp(source: ModelSource) -> str:
    """`files_stamp` of `source`'s checkpoint and HF config."""
    return files_stamp(source.checkpoint, source.hf_dir)


def export_record(out: Path) -> dict | None:
    """`out`'s nemo_topr_export.json, None where there is none that reads as one."""
    try:
        record = json.loads((out / EXPORT_RECORD).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def current_exports(targets: dict[ModelSource, Path]) -> set[ModelSource]:
    """The targets that already hold an export of their very checkpoint, both unchanged since: their
    nemo_topr_export.json names it, its stamp (`checkpoint_stamp`) and the stamp of the export's
    own files (a shard truncated or deleted since is no current export)."""
    current = set()
    for source, out in targets.items():
        record = export_record(out) or {}
        if (record.get("checkpoint") == str(source.checkpoint) and record.get("stamp") == checkpoint_stamp(source)
                and record.get("model_stamp") == files_stamp(out)):
            current.add(source)
    return current


def check_outputs(targets: dict[ModelSource, Path], overwrite: bool, kept: set[ModelSource] = frozenset()) -> None:
    """Refuse, `overwrite` or not, a target that is, holds or lies inside the checkpoint it is
    exported from (its root of iter_* directories, its HF config): replacing it would delete the
    weights being exported, or leave an HF model where Megatron looks for iterations. Refuse any
    other non-empty target, but those `kept`, unless `overwrite` and it is an earlier export: a
    mistyped --hf-out could name the base model."""
    for source, out in targets.items():
        target, root, hf_dir = out.resolve(), source.checkpoint.parent.resolve(), source.hf_dir.resolve()
        for read in (source.path.resolve(), root, hf_dir):
            inside = read in target.parents and read in (root, hf_dir)  # in a run's directory, beside them: fine
            if target == read or target in read.parents or inside:
                where = "is" if target == read else "holds" if target in read.parents else "is inside"
                raise ModelSourceError(f"{out}: {where} {read}, part of the checkpoint being exported; writing "
                                       f"there would replace or corrupt it: choose an --hf-out outside {root}",
                                       key="export.hf_out.in_the_checkpoint", where="--hf-out")
    for source, out in targets.items():
        check_parents(out)
        if source in kept or not out.exists() or (out.is_dir() and not any(out.iterdir())):
            continue
        if not overwrite:
            earlier = (export_record(out) or {}).get("checkpoint") == str(source.checkpoint)
            raise ModelSourceError(f"{out}: " + ("holds an export of this checkpoint whose files, or the "
                                                 "checkpoint's, changed since; pass --overwrite to export it again"
                                                 if earlier else "exists and is not empty; export writes a new "
                                                 "directory (pass --overwrite to replace it)"),
                                   key="export.hf_out.not_empty", where="--hf-out")
        if not (out / EXPORT_RECORD).is_file():
            raise ModelSourceError(f"{out}: exists and holds no {EXPORT_RECORD}, so it is no earlier export; "
                                   "--overwrite replaces only those: remove it yourself or choose another --hf-out",
                                   key="export.hf_out.not_an_export", where="--hf-out")


def check_one_checkpoint_per_folder(source: ModelSource, folder: Path) -> None:
    """--iteration / --all-iterations write HF_OUT/iter_NNNNNNN: refuse an HF_OUT that holds exports
    of another checkpoint's iterations, which would sit beside these as one run's (a round-2 run
    exported into round 1's folder mixed the two, and --overwrite left round 1's later iterations)."""
    root = str(source.checkpoint.parent)
    for record in sorted(folder.glob(f"iter_*/{EXPORT_RECORD}")):
        exported_from = (export_record(record.parent) or {}).get("checkpoint")
        if isinstance(exported_from, str) and str(Path(exported_from).parent) != root:
            raise ModelSourceError(f"{folder}: holds {record.parent.name}, exported from {exported_from}, another "
                                   f"checkpoint than {root}: its iterations and these would sit in one folder as one "
                                   "run's; choose another --hf-out",
                                   key="export.hf_out.another_checkpoints", where="--hf-out")


def check_parents(out: Path) -> None:
    """Refuse an `out` (resolved) below a file, which failed only when written, after Megatron's
    start-up ("Not a directory"), or inside an earlier export: `--iteration 1 --hf-out EXPORT`
    wrote EXPORT/iter_0000001 into that model's directory without a word."""
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise ModelSourceError(f"{out}: {parent} is not a directory, so nothing can be written under it: "
                                   "choose another --hf-out", key="export.hf_out.under_a_file", where="--hf-out")
        if (parent / EXPORT_RECORD).is_file():
            raise ModelSourceError(f"{out}: inside {parent}, an earlier export (it holds {EXPORT_RECORD}): a model "
                                   "written there would nest in that model's directory; choose an --hf-out outside "
                                   "it (--iteration and --all-iterations write HF_OUT/iter_NNNNNNN)",
                                   key="export.hf_out.inside_an_export", where="--hf-out")


@dataclass(frozen=True)
class ExportSpec:
    """What `nemo-topr export` will do: `ckpt` as given (RUN, RUN@N, a root or an iter_* directory),
    `hf_out` resolved (`--hf-out .` has a name to put a partial directory beside, a symlink its target),
    the iterations chosen by option (None: `ckpt`'s own; `all_iterations`: every saved one)."""

    ckpt: str
    hf_out: Path
    iterations: tuple[int, ...] | None = None
    all_iterations: bool = False
    device: str = "cuda"
    overwrite: bool = False

    @classmethod
    def of(cls, ckpt: str | Path, hf_out: str | Path, iterations: Iterable[int] | None = None,
           all_iterations: bool = False, device: str = "cuda", overwrite: bool = False) -> ExportSpec:
        return cls(str(ckpt), Path(hf_out).resolve(), None if iterations is None else tuple(iterations),
                   all_iterations, device, overwrite)

    def source(self) -> ModelSource:
        return resolve(self.ckpt, named="--ckpt ", expected=EXPORTED_KINDS)

    def targets(self, source: ModelSource) -> dict[ModelSource, Path]:
        """{checkpoint: HF directory} of `source` (`export_targets`); raises its first problem."""
        iterations = source.saved_iterations() if self.all_iterations else self.iterations
        return export_targets(source, self.hf_out, None if iterations is None else list(iterations))


def validate(spec: ExportSpec) -> list[UserError]:
    """Every problem of `spec` before Megatron's import, nothing written: the device (for cpu, the GPUs
    hidden from this process, as Megatron's start needs), the checkpoint and its iterations, then the
    outputs (`check_one_checkpoint_per_folder`, `check_outputs`) and each checkpoint's files whole."""
    problems = Problems()
    with problems.check():
        select_device(spec.device, where="--device")
    targets = None
    with problems.check():
        source = spec.source()
        if spec.iterations is not None or spec.all_iterations:
            check_one_choice_of_iterations(spec.ckpt, source, "--all-iterations" if spec.all_iterations
                                           else "--iteration")
        targets = spec.targets(source)
    if targets is None:  # nothing to write or read: the checkpoint's own problem says why
        return problems
    with problems.check():
        if spec.iterations is not None or spec.all_iterations:
            # first: with --overwrite, the other checkpoint's exports would be replaced in part
            check_one_checkpoint_per_folder(source, spec.hf_out)
        check_outputs(targets, spec.overwrite, set() if spec.overwrite else current_exports(targets))
    with problems.check():
        for checkpoint in targets:
            check_intact(checkpoint)
    return problems


def export(ckpt: str | Path, hf_out: str | Path, iterations: list[int] | None = None,
           device: str = "cuda", overwrite: bool = False) -> dict[Path, tuple[Path, bool]]:
    """Export checkpoint(s) of `ckpt` (see export_targets) on `device` (`nemo_topr.model.device`):
    `run` of an `ExportSpec` that `validate` finds nothing wrong with."""
    spec = ExportSpec.of(ckpt, hf_out, iterations, device=device, overwrite=overwrite)
    refuse(validate(spec), key="export.several_problems")
    return run(spec)


def run(spec: ExportSpec) -> dict[Path, tuple[Path, bool]]:
    """Export `spec`'s checkpoints, `validate`d. Each goes to a sibling `.NAME.partial` directory first
    and replaces its target only once complete, so an interrupted export leaves no half-written model
    under the target's name. A target holding a current export of its checkpoint (`current_exports`)
    is kept, unless `overwrite`. Returns {checkpoint directory: (HF directory, kept)}."""
    source = spec.source()
    targets = spec.targets(source)
    kept = set() if spec.overwrite else current_exports(targets)
    if len(kept) < len(targets):
        use_device(spec.device, where="--device")  # imports Megatron (10-20 s): only once the inputs are known good
        from nemo_topr.model.providers import config_only_bridge

        bridge = config_only_bridge(source.hf_dir)
    progress = Progress("export", len(targets) - len(kept), "checkpoints")
    for checkpoint, out in targets.items():
        partial, replaced = out.with_name(f".{out.name}.partial"), out.with_name(f".{out.name}.replaced")
        if checkpoint in kept and not (partial.exists() or replaced.exists()):
            continue  # nothing to write or clear: a read-only folder of current exports is only read
        held = claim_partial(partial, out)
        try:
            shutil.rmtree(replaced, ignore_errors=True)  # left by an interrupted export
            if checkpoint in kept:
                partial.rmdir()
                continue
            write_export(bridge, checkpoint, partial, out)
            move_into_place(partial, out, replaced)
        finally:
            os.close(held)
        progress.advance()
    return {checkpoint.checkpoint: (out, checkpoint in kept) for checkpoint, out in targets.items()}


def claim_partial(partial: Path, out: Path) -> int:
    """Make `partial`, where `out`'s export is written, and hold an exclusive flock on it until the
    export has moved into place (the returned descriptor's close). One left by an interrupted export,
    unlocked, is removed first; one locked is another export writing `out` now: two exports into one
    target wrote one directory, so that one could end with the other checkpoint's weights under its
    record. Where the filesystem has no flock for directories (NFS), nothing is locked."""
    while True:
        try:
            partial.mkdir(parents=True)
        except FileExistsError:
            left = _locked(partial, out)
            if left is not None:  # interrupted earlier
                shutil.rmtree(partial, ignore_errors=True)
                os.close(left)
            continue
        except OSError as error:  # a read-only folder
            raise ExportWriteError(f"writing {out}: {error.strerror or error} ({error.filename})",
                                   key="export.hf_out.unmakeable", where="--hf-out") from error
        held = _locked(partial, out)
        try:
            if held is not None and os.fstat(held).st_ino == partial.stat().st_ino:
                return held  # not removed by another export between mkdir and flock
        except FileNotFoundError:
            pass
        if held is not None:
            os.close(held)


def _locked(directory: Path, out: Path) -> int | None:
    """A descriptor of `directory` holding its flock, None where it has gone meanwhile; refused while
    another process holds it."""
    try:
        held = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(held)
        raise ExportWriteError(f"{out}: another export is writing it now ({directory} is locked): wait for it to end, "
                               "or choose another --hf-out", key="export.hf_out.locked", where="--hf-out") from None
    except OSError:  # no flock here: as before, unlocked
        pass
    return held


def write_export(bridge, checkpoint: ModelSource, partial: Path, out: Path) -> None:
    """Bridge's HF export of `checkpoint` into `partial`, with the record naming its source and the
    stamps that make it current; removed, and named in one line, if it cannot be written."""
    try:
        stamp = checkpoint_stamp(checkpoint)  # before the export: a checkpoint changed meanwhile is not current
        bridge.export_ckpt(str(checkpoint.checkpoint), str(partial), show_progress=False)
        (partial / EXPORT_RECORD).write_text(json.dumps(
            {"source": str(checkpoint.path), "checkpoint": str(checkpoint.checkpoint),
             "iteration": checkpoint.iteration, "hf_config": str(checkpoint.hf_dir), "stamp": stamp,
             "model_stamp": files_stamp(partial)}, indent=2) + "\n")
    except BaseException as error:  # a full disk, say: what was written would only take more room
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(error, (OSError, _safetensors_error())):
            raise ExportWriteError(f"writing {out}: {error} (the partial export is removed)",
                                   key="export.write_failed", where="--hf-out") from error
        raise


def move_into_place(partial: Path, out: Path, replaced: Path) -> None:
    """`partial`, a whole export, becomes `out`. An earlier export there (with --overwrite) is set
    aside first, not deleted in place, where a stop would leave half a model with its record. An
    empty `out` (the shell's own directory, a mount point) is filled in place and stays that
    directory, the record last, so that a move cut short leaves no record: no export taken as
    current. A move that fails (another filesystem refusing, a read-only directory) is one line,
    with the partial export removed and `out` as it was, not a traceback after the export."""
    moved = []
    try:
        if out.is_dir() and any(out.iterdir()):
            out.rename(replaced)
        if out.is_dir():
            for entry in sorted(partial.iterdir(), key=lambda entry: entry.name == EXPORT_RECORD):
                moved.append(Path(shutil.move(entry, out / entry.name)))  # copied where out is another filesystem
            partial.rmdir()
        else:
            partial.rename(out)
    except OSError as error:
        for path in moved:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        if replaced.exists() and not out.exists():
            replaced.rename(out)
        shutil.rmtree(partial, ignore_errors=True)
        raise ExportWriteError(f"moving the export into {out}: {error.strerror or error} ({error.filename}); the "
                               f"partial export is removed and {out} left as it was",
                               key="export.move_failed", where="--hf-out") from error
    shutil.rmtree(replaced, ignore_errors=True)


def check_one_choice_of_iterations(ckpt: str, source: ModelSource, option: str) -> None:
    """RUN@N or an iter_* directory chooses an iteration; with `option` as well, one of the two
    choices would be dropped without a word (`--ckpt RUN@10 --iteration 5` would export 5)."""
    directory, at = split_iteration(ckpt)
    if at or source.path == source.checkpoint:
        whole = directory if at else source.checkpoint.parent
        raise ModelSourceError(f"--ckpt {ckpt} names one iteration and {option} chooses the iterations too: give "
                               f"--ckpt {whole} with {option}, or drop {option}",
                               key="export.ckpt.iteration_chosen_twice", where="--ckpt")


def main(argv: list[str]) -> int:
    parser = Parser(prog="nemo-topr export", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="run directory (RUN or RUN@ITERATION), Megatron checkpoint "
                        "root, or one iter_* directory")
    parser.add_argument("--hf-out", required=True, help="output Hugging Face directory (a parent directory "
                        "with --iteration / --all-iterations)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--iteration", type=non_negative, nargs="+", help="export these saved iterations")
    which.add_argument("--all-iterations", action="store_true", help="export every saved iteration")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export (a directory holding "
                        "its nemo_topr_export.json), even a current one of the same checkpoint")
    add_device_argument(parser)
    args = parser.parse_args(argv)
    spec = ExportSpec.of(args.ckpt, args.hf_out, args.iteration, args.all_iterations, args.device, args.overwrite)
    refuse(validate(spec), key="export.several_problems")
    with stdout_to_stderr():  # stdout: the `exported`/`kept A -> B` lines alone
        exported = run(spec)
    for checkpoint, (out, kept) in exported.items():
        print(f"kept {checkpoint} -> {out} (exported earlier, unchanged since)" if kept
              else f"exported {checkpoint} -> {out}")
    return 0
