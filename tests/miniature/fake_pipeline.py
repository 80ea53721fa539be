"""The miniature pipeline faked for the study drivers' tests (studies 1-3): each step the driver
asks for is bookkeeping in seconds, with no Megatron start-up. Each fake is called through the real
step's signature (a call the real step would not take fails here too), and returns what the real
step returns in shape. Pretraining's probing and mu choice (`pretrain_mu`, `pretrain_mus`) stay
real, on a faked pretraining run. The real pipeline runs in test_miniature.py's smoke."""

from __future__ import annotations

import functools
import inspect
import shutil

PASS_AT_1 = 0.5           # every model's score on every split
PRETRAINING_SAVES = 2     # the faked pretraining run saves this many checkpoints, every save_interval


class KilledRun(Exception):
    pass


def _with_real_signature(real, fake):
    """`fake`, called as `real` would be: the call must bind to the real step's signature."""
    signature = inspect.signature(real)

    @functools.wraps(real)
    def checked(*args, **kwargs):
        signature.bind(*args, **kwargs)
        return fake(*args, **kwargs)

    return checked


def fake_pipeline(monkeypatch, calls, kill_at=None, positive_share=None, fail=None) -> dict[str, tuple]:
    """Replace the pipeline's steps; returns {run trained: (its data, its overrides)}, filled as they
    train. Each step that ran is counted in `calls` ("build", "pretrain", "dataset", "train"). Every
    model scores pass@1 PASS_AT_1 (half its samples correct, none malformed). The pretraining run
    saves PRETRAINING_SAVES checkpoints, every `checkpoint.save_interval` iterations. A seed's
    dataset has `positive_share[seed]` (default 0.5). From the `kill_at`-th training on every
    training raises, as in a killed process nothing more runs; the training of run `fail` fails as
    the real one does."""
    from nemo_topr.miniature import pipeline
    from nemo_topr.miniature.task import make_splits

    shares, trained = positive_share or {}, {}

    def count(step):
        calls[step] = calls.get(step, 0) + 1

    def build_task_and_model(out, sizes, task_seed, vocab_size, hidden_size):
        count("build")
        return make_splits(sizes, seed=task_seed), out / "init_hf"

    def train(name, hf_model, data, overrides, out, hf_root, threads=None):
        """The pretraining run (the variants' runs go through `train_variant`)."""
        assert name == "pretrain", name
        count("pretrain")
        interval = int(next(o for o in overrides if o.startswith("checkpoint.save_interval=")).split("=")[1])
        (out / "runs" / name / "checkpoints").mkdir(parents=True)
        exports = {i * interval: hf_root / f"iter_{i * interval:07d}" for i in range(1, PRETRAINING_SAVES + 1)}
        for directory in exports.values():
            directory.mkdir(parents=True)
        return out / "runs" / name, exports

    def offline_dataset(mu, problems, k, seed, directory, max_new_tokens):
        count("dataset")
        directory.mkdir(parents=True)
        (directory / "scored.jsonl").write_text("{}\n")
        p = shares.get(seed, 0.5)
        records = k * len(problems)
        return directory / "scored.jsonl", {"records": records, "positive_share": p, "correct": round(p * records),
                                            "wrong": records - round(p * records), "invalid": 0,
                                            "prompts_with_both": int(0 < p < 1)}

    def train_variant(name, mu, data, overrides, out, **kwargs):
        if kill_at is not None and calls.get("train", 0) + 1 >= kill_at:
            raise KilledRun(name)
        if name == fail:
            raise SystemExit(f"training {name} failed; full log: {out / 'runs' / name / 'train.log'}")
        count("train")
        trained[name] = (data, overrides)
        shutil.rmtree(out / "runs" / name, ignore_errors=True)  # as the real training does: a rerun starts afresh
        (out / "runs" / name / "checkpoints").mkdir(parents=True)
        return out / "runs" / name, {123: out / "exports" / name}

    def evaluate(model_dir, problems, prefix, num_samples, seed, max_new_tokens):
        correct = round(PASS_AT_1 * num_samples)
        return {"metrics": {"pass@1": PASS_AT_1, f"maj@{num_samples}": PASS_AT_1, "malformed_rate": 0.0},
                "per_problem": {"correct": [correct] * len(problems), "malformed": [0] * len(problems)},
                "examples": [" The answer is 1."]}

    for name, fake in (("build_task_and_model", build_task_and_model), ("train", train),
                       ("offline_dataset", offline_dataset), ("train_variant", train_variant),
                       ("evaluate", evaluate), ("telemetry", lambda run_dir: {})):
        monkeypatch.setattr(pipeline, name, _with_real_signature(getattr(pipeline, name), fake))
    return trained


def trained_objective(overrides: list[str]):
    """The ObjectiveConfig a training run with these overrides gets from the miniature preset (Hydra
    and the dataclass, which refuses an unknown key: no Megatron start-up)."""
    from omegaconf import OmegaConf

    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.config import compose

    return ObjectiveConfig(**OmegaConf.to_container(compose("miniature", ["hf_model=/nowhere", *overrides]).objective))
