"""What commands write never replaces what they did not make.

Directories emptied first (`make demo`'s --out, the miniature's results, `doctor --work-dir`):
only one the same command made; a mistyped path naming a checkout or a model is refused and
left byte for byte as it was. Output files (records, results, reports): never the file the
records are read from, and never a file that exists unless --overwrite. `iterate`'s out, which
it resumes in: only a directory it made."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forked
from tests.conftest import REPO, checkout_env
from nemo_topr.utils.outputs import (MARK, OutputError, OutputWriteError, claimed_output_dir, distinct_outputs,
                               fresh_output_dir, refuse_to_overwrite_an_input, writable_output_file, write_whole,
                               written_whole)


def _tree(root):
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def _run(cwd, *args) -> subprocess.CompletedProcess:
    """`python ARGS` as a user runs it, in `cwd`, on CPU, with this checkout first on PYTHONPATH
    (forked with Megatron imported: what is written is the subject, not the start-up)."""
    return forked.run(list(map(str, args)), cwd=cwd, env=checkout_env(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1"),
                      timeout=300)


def _refusal(proc: subprocess.CompletedProcess) -> str:
    """The last stderr line of a command that must have refused: exit status 1, no traceback."""
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return proc.stderr.strip().splitlines()[-1]


def test_a_new_or_empty_directory_is_made_and_marked(tmp_path):
    made = fresh_output_dir(tmp_path / "a" / "b", "nemo_topr.demo")
    assert made == (tmp_path / "a" / "b").resolve() and _tree(made) == {MARK: b"nemo_topr.demo\n"}
    (tmp_path / "empty").mkdir()
    assert _tree(fresh_output_dir(tmp_path / "empty", "nemo_topr.demo")) == {MARK: b"nemo_topr.demo\n"}


def test_the_commands_own_directory_is_emptied_for_the_rerun(tmp_path):
    out = fresh_output_dir(tmp_path / "out", "nemo_topr.demo")
    (out / "run" / "checkpoints").mkdir(parents=True)
    (out / "run" / "checkpoints" / "model.pt").write_bytes(b"old")
    (out / "summary.json").write_text("{}")
    again = fresh_output_dir(tmp_path / "out", "nemo_topr.demo")
    assert again == out and _tree(out) == {MARK: b"nemo_topr.demo\n"}


@pytest.mark.parametrize("mark", [None, "nemo-topr doctor", "nemo_topr.demo (edited)"])
def test_a_directory_the_command_did_not_make_is_refused_and_kept(tmp_path, mark):
    out = tmp_path / "model"
    (out / "weights").mkdir(parents=True)
    (out / "config.json").write_text('{"hidden_size": 8}')
    (out / "weights" / "model.safetensors").write_bytes(b"\x00" * 64)
    if mark is not None:
        (out / MARK).write_text(mark + "\n")
    before = _tree(out)
    with pytest.raises(OutputError) as refused:
        fresh_output_dir(out, "nemo_topr.demo")
    assert (refused.value.key, refused.value.where) == ("output_dir.not_its_own", str(out))
    assert _tree(out) == before


def test_a_file_in_the_way_is_refused_and_kept(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputError) as refused:
        fresh_output_dir(tmp_path / "notes.txt", "nemo-topr doctor")
    assert refused.value.key == "output_dir.not_a_directory"
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.slow
@pytest.mark.parametrize("command", [["-m", "nemo_topr.demo", "--out"],
                                     ["-m", "nemo_topr.miniature", "--out"],
                                     ["-m", "nemo_topr.miniature.study", "--docs", "", "--out"],
                                     ["-m", "nemo_topr.cli", "doctor", "--device", "cpu", "--work-dir"]],
                         ids=["demo", "miniature", "study", "doctor"])
def test_each_command_refuses_a_directory_it_did_not_make_before_doing_anything(tmp_path, command):
    """The whole command, as a user runs it, with --out naming a Hugging Face model directory:
    a one-line error naming the path, exit status 1, and the model untouched."""
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    assert f"{model} is not empty and has no {MARK} file" in _refusal(_run(tmp_path, *command, model))
    assert _tree(model) == {"config.json": b'{"model_type": "llama"}'}


def test_an_output_that_is_an_input_file_is_refused_by_any_spelling(tmp_path, monkeypatch):
    data = tmp_path / "runs" / "graded.jsonl"
    data.parent.mkdir()
    data.write_text("{}\n")
    (tmp_path / "link.jsonl").symlink_to(data)
    inputs = [str(data), tmp_path / "other.jsonl"]
    monkeypatch.chdir(tmp_path)
    for spelling in (data, "runs/graded.jsonl", "runs/../runs/graded.jsonl", "link.jsonl"):
        with pytest.raises(OutputError) as refused:
            refuse_to_overwrite_an_input(spelling, inputs)
        assert (refused.value.key, refused.value.where) == ("output.is_an_input", str(spelling))
    refuse_to_overwrite_an_input("runs/scored.jsonl", inputs)  # beside it: fine
    refuse_to_overwrite_an_input(tmp_path / "runs", [tmp_path / "runs" / "a.jsonl"])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    return build_tiny_hf_llama(tmp_path_factory.mktemp("tiny") / "hf", build_tiny_tokenizer())


@pytest.mark.parametrize("verb", [["data", "curate", "{data}", "--target-p", "0.25", "--out", "{data}"],
                                  ["score-logprobs", "--model", "{model}", "--data", "{data}", "--out", "{data}",
                                   "--no-strict", "--seq-length", "512", "--device", "cpu"],
                                  ["verifier", "build", "--graded", "{data}", "--out", "{data}"],
                                  ["verifier", "score", "--model", "{model}", "--records", "{data}", "--out", "{data}",
                                   "--device", "cpu"],
                                  ["generate", "--prompts", "{data}", "--task", "gsm8k", "--model", "{model}",
                                   "--max-new-tokens", "4", "--device", "cpu", "--out", "{data}"],
                                  ["eval", "--prompts", "{data}", "--task", "gsm8k", "--model", "{model}",
                                   "--max-new-tokens", "4", "--device", "cpu", "--out", "{data}.json",
                                   "--samples-out", "{data}", "--overwrite"]],
                         ids=["curate", "score-logprobs", "verifier-build", "verifier-score", "generate",
                              "eval-samples-out"])
@pytest.mark.slow
def test_each_command_refuses_to_write_its_records_over_its_input(tmp_path, tiny_model, verb):
    """Curating, or scoring with --no-strict, into the input itself would lose the records it
    drops, and generating into the prompts file would lose the prompts: every command that reads
    records or prompts and writes records refuses, before any model loads, --overwrite or not
    (`eval --samples-out` replaced its prompts file with the graded samples)."""
    data = tmp_path / "graded.jsonl"
    if verb[0] in ("generate", "eval"):  # its input is prompts, which it would replace with graded records
        data.write_text('{"prompt": "1+1=", "reference_answer": "2", "prompt_id": "p0"}\n')
    else:
        data.write_bytes((REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl").read_bytes())
    before = data.read_bytes()
    args = [part.format(data=data, model=tiny_model) for part in verb]
    proc = _run(tmp_path, "-m", "nemo_topr.cli", *args)
    assert _refusal(proc).endswith(
        f"{data} is also this command's input: writing the output there would replace what it reads; choose "
        "another output path")
    assert "[nemo-topr] model:" not in proc.stdout
    assert data.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["graded.jsonl"]


def test_an_output_file_in_place_of_a_directory_or_under_a_file_is_refused_and_no_directory_made(tmp_path,
                                                                                                 monkeypatch):
    """The directory is checked, not made: the write makes it, so a command refused after this
    check (by its next output, or its model) leaves no empty directory behind."""
    (tmp_path / "results").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputError) as refused:
        writable_output_file(tmp_path / "results")
    assert (refused.value.key, refused.value.where) == ("output.is_a_directory", "--out")
    for under_a_file in (tmp_path / "notes.txt" / "s.jsonl", tmp_path / "notes.txt" / "a" / "b" / "s.jsonl"):
        with pytest.raises(OutputError) as refused:
            writable_output_file(under_a_file, "--samples-out")
        assert (refused.value.key, refused.value.where) == ("output.directory_unmakeable", "--samples-out")
    assert writable_output_file(tmp_path / "new" / "deeper" / "r.json") == tmp_path / "new" / "deeper" / "r.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "results"]
    # root may write anywhere, so an unwritable directory is what os.access says for one path
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path / "results")
    with pytest.raises(OutputError) as refused:
        writable_output_file(tmp_path / "results" / "new" / "r.json")
    assert refused.value.key == "output.directory_unmakeable"
    assert str(refused.value).endswith(f"(Permission denied: {tmp_path}/results)")  # the directory os.access refused
    assert (tmp_path / "notes.txt").read_text() == "mine" and not any((tmp_path / "results").iterdir())


@pytest.mark.parametrize("verb, expected", [
    (["score-logprobs", "--model", "{model}", "--data", "{data}", "--out", "{file}/scored.jsonl", "--device", "cpu"],
     "--out {file}/scored.jsonl: its directory cannot be made (File exists: {file})"),
    (["eval", "--model", "{model}", "--benchmark", "gsm8k", "--limit", "1", "--device", "cpu", "--out", "{dir}"],
     "--out {dir} is a directory; a file is written there: name the file"),
    (["generate", "--prompts", "gsm8k-test", "--limit", "1", "--model", "{model}", "--device", "cpu",
      "--out", "{file}/g.jsonl"], "--out {file}/g.jsonl: its directory cannot be made (File exists: {file})"),
    (["import", "{model}", "{file}"], "{file}: exists and is not an empty directory; import writes a new checkpoint "
                                      "directory"),
], ids=["score-logprobs", "eval", "generate", "import"])
@pytest.mark.slow
def test_an_output_path_that_cannot_be_written_stops_the_command_before_its_work(tmp_path, tiny_model, verb,
                                                                                 expected):
    """Not after hours of sampling or scoring: a one-line error, nothing written, nothing loaded."""
    data = tmp_path / "graded.jsonl"
    data.write_bytes((REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl").read_bytes())
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "results").mkdir()
    paths = {"data": data, "model": tiny_model, "file": tmp_path / "notes.txt", "dir": tmp_path / "results"}
    proc = _run(tmp_path, "-m", "nemo_topr.cli", *[part.format(**paths) for part in verb])
    assert _refusal(proc).endswith(expected.format(**paths))
    assert "[nemo-topr] model:" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graded.jsonl", "notes.txt", "results"]
    assert not any((tmp_path / "results").iterdir()) and (tmp_path / "notes.txt").read_text() == "mine"


def test_an_existing_output_file_is_replaced_only_with_overwrite_and_an_input_never(tmp_path):
    scores = tmp_path / "scored.jsonl"
    scores.write_text("mine")
    with pytest.raises(OutputError) as refused:
        writable_output_file(scores)
    assert refused.value.key == "output.exists"
    assert writable_output_file(scores, overwrite=True) == scores and scores.read_text() == "mine"
    with pytest.raises(OutputError) as refused:
        writable_output_file(scores, overwrite=True, inputs=[scores])
    assert refused.value.key == "output.is_an_input"


def test_a_directory_resumed_in_is_claimed_once_and_never_emptied(tmp_path):
    out = claimed_output_dir(tmp_path / "iterate", "nemo-topr iterate")
    (out / "round_0").mkdir()
    (out / "round_0" / "graded.jsonl").write_text("{}\n")
    assert claimed_output_dir(out, "nemo-topr iterate") == out  # the resume: kept as it is
    assert _tree(out) == {MARK: b"nemo-topr iterate\n", "round_0/graded.jsonl": b"{}\n"}
    with pytest.raises(OutputError) as refused:
        fresh_output_dir(out, "nemo_topr.demo")
    assert refused.value.key == "output_dir.not_its_own"
    home = tmp_path / "home"
    home.mkdir()
    (home / "summary.md").write_text("my notes")
    with pytest.raises(OutputError) as refused:
        claimed_output_dir(home, "nemo-topr iterate", make=False)
    assert refused.value.key == "output_dir.not_its_own"
    assert _tree(home) == {"summary.md": b"my notes"}
    assert claimed_output_dir(tmp_path / "dry", "nemo-topr iterate", make=False) == tmp_path / "dry"
    assert not (tmp_path / "dry").exists()  # a dry run makes nothing


@pytest.mark.parametrize("make", [False, True], ids=["dry run", "run"])
def test_an_output_directory_that_cannot_be_made_is_one_line_in_a_dry_run_too(tmp_path, make):
    """`iterate out=FILE/sub` passed --dry-run, then ended in a NotADirectoryError traceback;
    under /sys (where root may write by the permission bits, and the kernel refuses) a
    PermissionError one."""
    (tmp_path / "FILE").write_text("mine")
    with pytest.raises(OutputError) as error:
        claimed_output_dir(tmp_path / "FILE" / "sub", "nemo-topr iterate", make=make)
    assert (error.value.key, error.value.where) == ("output_dir.unmakeable", str(tmp_path / "FILE" / "sub"))
    with pytest.raises(OutputError) as error:  # refused by the permission bits, or by the kernel's mkdir
        claimed_output_dir("/sys/nemo-topr-out", "nemo-topr iterate")
    assert error.value.key in ("output_dir.unmakeable", "output_dir.mkdir_failed")
    assert (tmp_path / "FILE").read_text() == "mine"


RECORDS_OUTPUT = {  # every command that writes records, its option naming them as JSON
    "curate": ["data", "curate", "{data}", "--target-p", "0.25", "--out", "{dir}/curated.json"],
    "score-logprobs": ["score-logprobs", "--model", "{model}", "--data", "{data}", "--out", "{dir}/curated.json",
                       "--seq-length", "512", "--device", "cpu"],
    "verifier-build": ["verifier", "build", "--graded", "{data}", "--out", "{dir}/curated.json"],
    "verifier-score": ["verifier", "score", "--model", "{model}", "--records", "{data}", "--out", "{dir}/curated.json",
                       "--device", "cpu"],
    "generate": ["generate", "--prompts", "gsm8k-test", "--limit", "1", "--model", "{model}", "--device", "cpu",
                 "--out", "{dir}/curated.json"],
    "eval-samples": ["eval", "--model", "{model}", "--benchmark", "gsm8k", "--limit", "1", "--device", "cpu",
                     "--samples-out", "{dir}/curated.json", "--out", "{dir}/eval.json"],
}


@pytest.mark.slow
@pytest.mark.parametrize("verb", sorted(RECORDS_OUTPUT))
def test_records_are_written_only_under_a_name_that_is_read_back_as_jsonl(tmp_path, tiny_model, verb):
    """`--out scored.json` was written, and `train` refused it only then ("unknown format '.json'"),
    after the hours of scoring or sampling: refused first, naming the name to use."""
    data = tmp_path / "graded.jsonl"
    data.write_bytes((REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl").read_bytes())
    out = tmp_path / "out"
    args = [a.format(data=data, dir=out, model=tiny_model) for a in RECORDS_OUTPUT[verb]]
    proc = _run(tmp_path, "-m", "nemo_topr.cli", *args)
    option = "--samples-out" if verb == "eval-samples" else "--out"
    assert _refusal(proc).endswith(f"{option} {out}/curated.json: records are written as JSONL, which is read back "
                                   f"only from a name ending in .jsonl: name it {out}/curated.jsonl")
    assert "[nemo-topr] model:" not in proc.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["graded.jsonl"]  # nothing written, no directory made


EXISTING_OUTPUT = {  # verb, what exists already, the one that is refused
    "curate": (["data", "curate", "{data}", "--target-p", "0.25", "--out", "{dir}/curated.jsonl"],
               ["curated.jsonl"], "--out {dir}/curated.jsonl"),
    "curate-stats": (["data", "curate", "{data}", "--target-p", "0.25", "--out", "{dir}/curated.jsonl"],
                     ["curated.stats.json"], "--out's stats {dir}/curated.stats.json"),
    "stats": (["data", "stats", "{data}", "--out", "{dir}"], ["stats.png"], "--out {dir}/stats.png"),
    "score-logprobs": (["score-logprobs", "--model", "{model}", "--data", "{data}", "--out", "{dir}/scored.jsonl",
                        "--seq-length", "512", "--device", "cpu"], ["scored.jsonl.report.json"],
                       "--out's report {dir}/scored.jsonl.report.json"),
    "verifier-build": (["verifier", "build", "--graded", "{data}", "--out", "{dir}/judge.jsonl"], ["judge.jsonl"],
                       "--out {dir}/judge.jsonl"),
    "verifier-score": (["verifier", "score", "--model", "{model}", "--records", "{data}", "--out", "{dir}/v.jsonl",
                        "--device", "cpu"], ["v.jsonl"], "--out {dir}/v.jsonl"),
    "generate": (["generate", "--prompts", "gsm8k-test", "--limit", "1", "--model", "{model}", "--max-new-tokens", "4",
                  "--device", "cpu", "--out", "{dir}/graded.jsonl"], ["graded.jsonl"], "--out {dir}/graded.jsonl"),
    "eval-markdown": (["eval", "--records", "{data}", "--task", "gsm8k", "--out", "{dir}/eval.json"], ["eval.md"],
                      "--out's Markdown {dir}/eval.md"),
    "eval-samples": (["eval", "--model", "{model}", "--benchmark", "gsm8k", "--limit", "1", "--max-new-tokens", "4",
                      "--device", "cpu", "--samples-out", "{dir}/samples.jsonl", "--out", "{dir}/eval.json"],
                     ["samples.jsonl"], "--samples-out {dir}/samples.jsonl"),
    "eval-plot": (["eval", "--plot", "{data}", "--out", "{dir}/rounds.png"], ["rounds.png"], "--out {dir}/rounds.png"),
    "doctor": (["doctor", "--device", "cpu", "--json", "{dir}/doctor.json"], ["doctor.json"],
               "--json {dir}/doctor.json"),
}


@pytest.mark.parametrize("verb", sorted(EXISTING_OUTPUT))
def test_each_command_refuses_an_output_file_that_exists_unless_overwrite(tmp_path, tiny_model, verb):
    """A user's earlier results, or a file of the same name they did not mean: a one-line error
    naming it before any model loads, the file as it was, and nothing else written."""
    args, existing, refused = EXISTING_OUTPUT[verb]
    data, out = tmp_path / "graded.jsonl", tmp_path / "out"
    data.write_bytes((REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl").read_bytes())
    out.mkdir()
    for name in existing:
        (out / name).write_text("an earlier result\n")
    command = ["-m", "nemo_topr.cli", *[a.format(data=data, dir=out, model=tiny_model) for a in args]]
    proc = _run(tmp_path, *command)
    assert _refusal(proc).endswith(
        refused.format(dir=out) + " exists: pass --overwrite to replace it, or choose another path")
    assert "[nemo-topr] model:" not in proc.stdout
    assert _tree(out) == {name: b"an earlier result\n" for name in existing}
    if verb in ("curate", "curate-stats", "stats", "verifier-build"):  # no model: cheap to finish
        proc = _run(tmp_path, *command, "--overwrite")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert all((out / name).read_bytes() != b"an earlier result\n" for name in existing)


@pytest.mark.parametrize("args, message", [
    (["eval", "--records", "{data}", "--out", "{dir}/r.md"], "--out's Markdown {dir}/r.md is also --out"),
    (["eval", "--benchmark", "gsm8k", "--model", "{dir}/model", "--samples-out", "{dir}/r.json", "--out", "{dir}/r.json"],
     "--samples-out {dir}/r.json is also --out"),
    (["data", "curate", "{data}", "--stats", "{dir}/c.jsonl", "--out", "{dir}/c.jsonl"],
     "--stats {dir}/c.jsonl is also --out"),
], ids=["eval-markdown", "eval-samples", "curate-stats"])
def test_two_outputs_of_one_command_at_one_path_are_refused(tmp_path, capsys, args, message):
    """The second write would replace the first: refused before any work, in-process (no model)."""
    from nemo_topr import cli

    data = REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl"
    assert cli.main([a.format(data=data, dir=tmp_path) for a in args]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(message.format(dir=tmp_path) + ": the command writes both; give them different paths")
    assert list(tmp_path.iterdir()) == []
    distinct_outputs({"--out": tmp_path / "a", "--stats": None, "--samples-out": tmp_path / "b"})  # fine


@pytest.fixture
def full_disk(monkeypatch):
    """Every file written whole (`written_whole`'s PATH.partial) goes to /dev/full, whose writes
    fail with the kernel's ENOSPC, as on a full filesystem (a real one would need a mount)."""
    real_open = Path.open

    def onto_a_full_disk(self, mode="r", *args, **kwargs):
        return real_open(Path("/dev/full") if self.name.endswith(".partial") else self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", onto_a_full_disk)


EVAL_RECORDS = "".join(json.dumps({"prompt": "1+1=", "completion": f"The answer is {answer}", "reward": reward,
                                   "prompt_id": "p0", "sample_id": i, "meta": {"reference_answer": "2"}}) + "\n"
                       for i, (answer, reward) in enumerate([(2, 1.0), (3, -1.0)]))


@pytest.mark.parametrize("verb, written", [
    (["data", "curate", "{data}", "--target-p", "0.25", "--out", "{out}/round1/curated.jsonl"], "curated.jsonl"),
    (["eval", "--records", "{data}", "--task", "gsm8k", "--k", "2", "--out", "{out}/round1/eval.json"], "eval.json"),
], ids=["curate", "eval"])
def test_a_full_filesystem_ends_the_command_in_one_line_and_leaves_nothing(tmp_path, capsys, full_disk, verb,
                                                                          written):
    """It ended in an OSError traceback naming no file (score-logprobs on a full 40 KB tmpfs, by
    hand); now one line naming the output, no partial file, and not the folders made for it."""
    from nemo_topr import cli

    data = tmp_path / "graded.jsonl"
    if verb[0] == "eval":
        data.write_text(EVAL_RECORDS)
    else:
        data.write_bytes((REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl").read_bytes())
    out = tmp_path / "out"
    status = cli.main([part.format(data=data, out=out) for part in verb])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 1 and line.startswith(f"nemo-topr {' '.join(verb[:2]) if verb[0] == 'data' else verb[0]}: ")
    assert line.endswith(f"writing {out / 'round1' / written}: No space left on device ({written} not written); "
                         "free space there or choose another path")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graded.jsonl"]


def test_a_file_the_full_filesystem_could_not_replace_is_left_as_it_was(tmp_path, full_disk):
    results = tmp_path / "eval.json"
    results.write_text("the earlier results\n")
    with pytest.raises(OutputWriteError) as refused:
        write_whole(results, "new results\n")
    assert (refused.value.key, refused.value.where) == ("output.filesystem_full", str(results))
    assert results.read_text() == "the earlier results\n" and sorted(tmp_path.iterdir()) == [results]
    # what the program raises inside the block is its own error, not the filesystem's
    with pytest.raises(KeyError):
        with written_whole(tmp_path / "new" / "r.jsonl"):
            raise KeyError("a field")
    assert sorted(tmp_path.iterdir()) == [results]


def test_a_file_over_the_shells_size_limit_is_named_with_that_limit(tmp_path):
    """The kernel's own EFBIG: `ulimit -f` of 4 KiB (RLIMIT_FSIZE) under `data curate`, whose
    curated records are larger. Python ignores SIGXFSZ, so the write fails instead of the process."""
    import resource

    def four_kib():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    data = REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl"
    out = tmp_path / "round1" / "curated.jsonl"
    proc = subprocess.run([sys.executable, "-B", "-m", "nemo_topr.cli", "data", "curate", str(data), "--target-p",
                           "0.25", "--out", str(out)], env=checkout_env(), preexec_fn=four_kib,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        f"nemo-topr data curate: writing {out}: File too large (curated.jsonl not written); the file is larger than "
        "`ulimit -f` (or the filesystem) allows: raise the limit or choose another path"), proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code, said", [
    (errno.EDQUOT, "Disk quota exceeded (r.jsonl not written); free space within your quota there (or have it "
                   "raised) or choose another path"),
    (errno.EIO, "Input/output error (r.jsonl not written); check the filesystem (its disk or mount; the kernel log "
                "names the fault) or choose another path"),
])
def test_a_quota_or_a_failing_disk_gets_its_own_advice(tmp_path, monkeypatch, code, said):
    def refused(self, *args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(Path, "open", refused)
    with pytest.raises(OutputWriteError) as raised:
        write_whole(tmp_path / "r.jsonl", "a record\n")
    assert str(raised.value) == f"writing {tmp_path / 'r.jsonl'}: {said}"


@pytest.mark.slow
def test_a_demo_run_again_says_it_empties_the_earlier_one(tmp_path, monkeypatch, capsys):
    """`make demo` run again emptied runs/demo and trained anew without a word."""
    from nemo_topr import demo

    def stop(*args, **kwargs):
        raise SystemExit("stopped after the output directory")

    monkeypatch.setattr("nemo_topr.model.providers.build_tiny_hf_llama", stop)
    earlier = fresh_output_dir(tmp_path / "demo", "nemo_topr.demo")
    (earlier / "run").mkdir()
    new = tmp_path / "new"
    for out in (new, earlier):
        with pytest.raises(SystemExit, match="stopped"):
            demo.main(["--out", str(out)])
        said = capsys.readouterr().out.split("[1/")[0]
        assert (str(out.resolve()) in said) is (out == earlier), said
    assert _tree(earlier) == {MARK: b"nemo_topr.demo\n"}
