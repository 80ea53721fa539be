"""A second implementation as the forward's oracle: the same weights in Hugging Face transformers.

Every other exactness test compares the project's forward with itself (another layout, packed
vs padded, shared vs unshared), so a bug on both sides cancels. Here the reference is
``LlamaForCausalLM`` on the HF directory Bridge loads the Megatron model from: log pi of each
completion, one sequence at a time, unpacked, summed by hand (`hf_completion_logprobs`). It
checks packed training (the step-zero log pi and TOPR loss of `ToprForwardStep`),
`score-logprobs` and shared-prefix rows.

Tolerance: fp32 on CPU, two implementations of the same math (RoPE, GQA, RMSNorm, SwiGLU in
another order of operations): per-sequence sums of ~30 token log-probs (|log pi| ~ 200) agree to
1e-6 relative (measured 2e-8, printed); a token attributed to the wrong sequence,
a shifted label or a wrong position moves a sum by whole log-probs (>= 1e-2 relative).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

RTOL = 1e-6
SEQ_LENGTH = 256
# prompt -> completions (rewards alternate -1, +1): shared prompts for shared-prefix rows, varied
# lengths so that packed rows hold sequences of different lengths.
COMPLETIONS = {
    "p0": ["There are two apples.", "Three apples and one pear, so four fruit in all.", "None.",
           "Two and two make four apples in the basket today."],
    "p1": ["The answer is seven because three plus four is seven.", "Seven."],
    "p2": ["I think the basket holds about eleven apples, maybe twelve if one is hidden."],
}
# log mu - log pi(theta_0), by sample: log rho = -offset (negatives above and below rho = 1)
OFFSETS = (-0.5, 0.7, 2.0, -1.0, 0.3, 1.5, -0.2)


def hf_completion_logprobs(hf_model, seqs) -> dict[int, float]:
    """{sample_id: sum over completion tokens of log p(token | all tokens before it)}: one
    unpadded sequence per forward, plain log_softmax, nothing of nemo_topr's forward."""
    result = {}
    with torch.no_grad():
        for seq in seqs:
            ids = torch.tensor([seq.input_ids])
            logits = hf_model(input_ids=ids).logits[0].double()
            token_logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0]
            completion = torch.tensor(seq.loss_mask[1:], dtype=torch.bool)  # token t is predicted at t - 1
            assert seq.loss_mask[0] == 0 and completion.sum() == sum(seq.loss_mask)
            result[seq.sample_id] = token_logprobs[completion].sum().item()
    return result


def _assert_matches_oracle(got: dict[int, float], oracle: dict[int, float], what: str) -> None:
    assert sorted(got) == sorted(oracle), what
    worst = max(abs(got[k] - oracle[k]) / abs(oracle[k]) for k in oracle)
    assert worst <= RTOL, f"{what}: log pi differs from transformers' by {worst:.2e} relative: {got} vs {oracle}"
    print(f"{what}: worst relative difference from transformers {worst:.1e}")


@pytest.fixture(scope="module")
def oracle(tmp_path_factory, megatron_world):
    """The tiny HF Llama, its records file, their token sequences and transformers' log pi."""
    from transformers import LlamaForCausalLM

    from nemo_topr.data.records import load_records
    from nemo_topr.data.tokenization import load_tokenizer, tokenize_records
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("hf_oracle")
    hf_dir = build_tiny_hf_llama(root / "hf", build_tiny_tokenizer(), seed=7)
    records = [{"prompt": f"Question {prompt}: how many apples are in the basket?", "prompt_id": prompt,
                "completion": text, "reward": 1.0 if k % 2 else -1.0, "behavior_logprob": -100.0}
               for prompt, texts in COMPLETIONS.items() for k, text in enumerate(texts)]
    data = root / "records.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    seqs = tokenize_records(load_records(data), load_tokenizer(hf_dir), max_seq_length=SEQ_LENGTH).sequences
    hf_model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    return {"hf_dir": hf_dir, "data": data, "seqs": seqs, "logprobs": hf_completion_logprobs(hf_model.eval(), seqs)}


def _megatron_model(hf_dir):
    """The Megatron model as training and scoring build it: Bridge loads the HF weights."""
    from nemo_topr.model import source as model_source
    from nemo_topr.model.providers import load_model, source_provider

    source = model_source.resolve(hf_dir)
    _, provider = source_provider(source, seq_length=SEQ_LENGTH)
    provider.finalize()
    return load_model(source, provider)[0].eval()


def test_packed_training_step_zero_matches_transformers(oracle):
    """log pi of every sequence in packed rows, and the TOPR loss of `ToprForwardStep` at step 0,
    against log pi from transformers and the loss formula written out (module docstring of
    nemo_topr/objective.py) on those values."""
    from nemo_topr.data.packing import collate_packed, pack_sequences, set_group_mean_rewards
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import ToprForwardStep, completion_logprob_table

    seqs, hf_logpi = oracle["seqs"], oracle["logprobs"]
    for seq in seqs:  # batches carry log mu in fp32: take values fp32 holds exactly
        mu = hf_logpi[seq.sample_id] + OFFSETS[seq.sample_id % len(OFFSETS)]
        seq.behavior_logprob = torch.tensor(mu, dtype=torch.float32).item()
    set_group_mean_rewards(seqs)
    rows = pack_sequences(seqs, SEQ_LENGTH, 0)
    batch = collate_packed(seqs, rows, SEQ_LENGTH, 0)
    assert len(rows) < len(seqs) and max(len(row) for row in rows) >= 3  # really packed

    model = _megatron_model(oracle["hf_dir"])
    with torch.no_grad():
        output, loss_func = ToprForwardStep(ObjectiveConfig())(None, iter([batch]), model)
        table, _ = completion_logprob_table(output, batch, int(batch["seq_len"].max()))
        loss_sum, denominator, _ = loss_func(output)
    _assert_matches_oracle(dict(zip(batch["sample_ids"].tolist(), table.sum(-1).tolist())), hf_logpi,
                           "packed training forward")

    # TOPR, sequence-mean: loss = -(1/B) sum_i w_i R_i s_i / n_i, w_i = 1 for R_i >= 0 and
    # min(rho_i, 1) for R_i < 0, log rho_i = s_i - log mu_i (~ -offset_i).
    terms = []
    for seq in seqs:
        log_rho = hf_logpi[seq.sample_id] - seq.behavior_logprob
        weight = 1.0 if seq.reward >= 0 else min(math.exp(log_rho), 1.0)
        terms.append(weight * seq.reward * hf_logpi[seq.sample_id] / sum(seq.loss_mask))
    assert {seq.reward for seq in seqs} == {1.0, -1.0}
    assert any(seq.reward < 0 and OFFSETS[seq.sample_id % len(OFFSETS)] > 0 for seq in seqs)  # some w < 1
    assert int(denominator) == len(seqs)
    # each term to RTOL (fp32 log rho: an ulp of |log mu| ~ 50 is 4e-6), so the sum to RTOL sum |term|
    expected, scale = -math.fsum(terms) / len(seqs), math.fsum(map(abs, terms)) / len(seqs)
    assert abs(loss_sum.item() / len(seqs) - expected) <= RTOL * scale, (loss_sum.item() / len(seqs), expected)


@pytest.mark.parametrize("shared_prefix", [False, True], ids=["packed", "shared_prefix"])
def test_score_logprobs_matches_transformers(oracle, tmp_path, shared_prefix):
    from nemo_topr.data.shared_prefix import pack_shared
    from nemo_topr.training.scoring import score_logprobs

    if shared_prefix:  # the rows really share prompts: some block holds several completions
        assert any(len(block) > 1 for row in pack_shared(oracle["seqs"], SEQ_LENGTH) for block in row)
    out = tmp_path / "scored.jsonl"
    summary = score_logprobs(oracle["hf_dir"], oracle["data"], out, seq_length=SEQ_LENGTH, rows_per_batch=2,
                             device="cpu", shared_prefix=shared_prefix)
    assert summary["records_scored"] == len(oracle["seqs"])
    scores = {k: json.loads(line)["behavior_logprob"] for k, line in enumerate(out.read_text().splitlines())}
    _assert_matches_oracle(scores, oracle["logprobs"], f"score-logprobs shared_prefix={shared_prefix}")
    # every input record had log mu = -100: the summary says how far transformers' log pi is from it
    changes = [abs(oracle["logprobs"][seq.sample_id] + 100.0) for seq in oracle["seqs"]]
    replaced, tolerance = summary["replaced_behavior_logprobs"], RTOL * max(map(abs, oracle["logprobs"].values()))
    assert replaced["records"] == len(oracle["seqs"])
    assert replaced["mean_abs_change"] == pytest.approx(math.fsum(changes) / len(changes), rel=0, abs=tolerance)
    assert replaced["max_abs_change"] == pytest.approx(max(changes), rel=0, abs=tolerance)
