"""The generative verifier: judge data, P(Yes), the weighted vote, and TOPR training end to end."""

import json
import math
import sys

import pytest
import torch

from tests import forked
from tests.conftest import cli_verb, placeholder_hf_model, refusal
from nemo_topr.data.records import Record, load_records
from nemo_topr.evaluation import evaluate, verifier
from nemo_topr.evaluation.verifier import NO, YES, judge_accuracy, judge_prompt, judge_records, judged_problem

verifier_main = cli_verb("verifier")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    return build_tiny_hf_llama(tmp_path_factory.mktemp("tiny_llama"), build_tiny_tokenizer())


def graded(prompt, completion, reward, reference="5", sample_id=0, prompt_id="q"):
    meta = {"task": "gsm8k", "reference_answer": reference, "grade": "correct" if reward > 0 else "wrong"}
    return Record(prompt=prompt, completion=completion, reward=reward, prompt_id=prompt_id, sample_id=sample_id,
                  meta=meta, index=sample_id)


def write_records(records, path):
    path.write_text("".join(json.dumps(record.to_json()) + "\n" for record in records))
    return path


# ---------------------------------------------------------------------------------------------
# Judge data


def test_judged_problem_keeps_the_question_not_the_few_shot_demonstrations():
    eight_shot = "Question: 1+1?\nAnswer: 2.\nThe answer is 2.\n\nQuestion: What is 2+3?\nAnswer:"
    assert judged_problem(eight_shot) == "Question: What is 2+3?"
    math_prompt = "Solve the following math problem. Put it in \\boxed{}.\n\nProblem: 2+3?"
    assert judged_problem(math_prompt) == math_prompt
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    assert judged_problem(chat) == "What is 2+3?"


def test_judge_records_hold_both_judgments_rewarded_by_the_grade():
    right = graded("Question: What is 2+3?\nAnswer:", " 2+3=5.\nThe answer is 5. ", 1.0, sample_id=0)
    wrong = graded("Question: What is 2+3?\nAnswer:", " 2+3=6.\nThe answer is 6.", -1.0, sample_id=1)
    judge = judge_records([right, wrong])
    expected_prompt = ("Question: What is 2+3?\n\nProposed solution:\n2+3=5.\nThe answer is 5.\n\n"
                       "Is the answer correct? Answer Yes or No.")
    assert judge[0].prompt == judge[1].prompt == expected_prompt
    assert [(r.completion, r.reward, r.prompt_id, r.sample_id) for r in judge] == [
        (" Yes", 1.0, "judge-0", "yes"), (" No", -1.0, "judge-0", "no"),  # correct sample: Yes is right
        (" Yes", -1.0, "judge-1", "yes"), (" No", 1.0, "judge-1", "no"),  # wrong sample: No is right
    ]
    assert judge[2].meta == {"judged_prompt_id": "q", "judged_sample_id": 1, "judged_correct": False}


def test_build_writes_a_valid_pre_scored_dataset(tmp_path):
    records = [graded("Question: What is 2+3?\nAnswer:", f" The answer is {n}.", 1.0 if n == 5 else -1.0,
                      sample_id=n) for n in (4, 5, 6)]
    out = tmp_path / "judge.jsonl"
    assert verifier_main(["build", "--graded", str(write_records(records, tmp_path / "graded.jsonl")),
                          "--out", str(out)]) == 0
    judge = load_records(out).records  # strict validation
    assert len(judge) == 6 and sum(r.reward > 0 for r in judge) == 3  # p = 1/2 by construction
    assert [r.completion for r in judge if r.reward > 0] == [NO, YES, NO]


def test_grades_without_a_negative_are_refused_not_all_judged_correct(model_dir, tmp_path, capsys):
    # graded 0/1: the wrong answers (0) are >= 0, the paper's "correct"; build would say Yes to them
    records = [graded("Question: What is 2+3?\nAnswer:", f" The answer is {n}.", 1.0 if n == 5 else 0.0,
                      sample_id=n) for n in (4, 5, 6)]
    path = write_records(records, tmp_path / "graded01.jsonl")
    for argv in (["build", "--graded", str(path), "--out", str(tmp_path / "judge.jsonl")],
                 ["score", "--model", str(model_dir), "--records", str(path), "--out", str(tmp_path / "s.jsonl")]):
        assert verifier_main(argv) == 1
        assert (f"{path}: reward: no reward is negative, yet the rewards take 2 values (0 to 1)"
                in capsys.readouterr().err)
    assert not (tmp_path / "judge.jsonl").exists() and not (tmp_path / "s.jsonl").exists()
    # one reward throughout (every sample correct) reads one way only: kept
    same = write_records([graded("Question: What is 2+3?\nAnswer:", " The answer is 5.", 1.0, sample_id=i)
                          for i in range(2)], tmp_path / "all_right.jsonl")
    assert verifier_main(["build", "--graded", str(same), "--out", str(tmp_path / "judge.jsonl")]) == 0
    # but for 0 throughout: 0/1 grades with no correct answer, which were built into "correct" judge examples
    zeros = write_records([graded("Question: What is 2+3?\nAnswer:", f" The answer is {n}.", 0.0, sample_id=n)
                           for n in (4, 6)], tmp_path / "all_wrong01.jsonl")
    assert verifier_main(["build", "--graded", str(zeros), "--out", str(tmp_path / "judge0.jsonl")]) == 1
    assert (f"{zeros}: reward: every reward is 0, which the sign reads as correct (0/1 grades with no correct "
            "answer?)" in capsys.readouterr().err)
    assert not (tmp_path / "judge0.jsonl").exists()


def test_a_prompt_rendered_by_the_chat_template_is_judged_as_its_plain_problem():
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    rendered = build_tiny_tokenizer().apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<|begin_of_text|><|start_header_id|>system")  # as a sampler read it
    expected = "What is 2+3?\n\nProposed solution:\n2+3=5.\n\nIs the answer correct? Answer Yes or No."
    for prompt in (rendered, chat, "What is 2+3?"):
        assert judge_prompt(graded(prompt, " 2+3=5.", 1.0)) == expected
    # a base model's rendering: BOS, then the 8-shot prompt
    eight_shot = "Question: 1+1?\nAnswer: 2.\nThe answer is 2.\n\nQuestion: What is 2+3?\nAnswer:"
    assert judged_problem("<|begin_of_text|>" + eight_shot) == judged_problem(eight_shot) == "Question: What is 2+3?"


def test_build_and_score_refuse_special_tokens_the_judge_prompt_would_hold_naming_row_and_field(model_dir, tmp_path):
    only_system = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
    cases = [(graded(only_system, " 5", 1.0), "prompt", "<|start_header_id|>"),
             (graded("What is 2+3?", " 5<|eot_id|>", 1.0), "completion", "<|eot_id|>")]
    for number, (record, field, token) in enumerate(cases):
        rows = [graded("What is 1+1?", " 2", 1.0, prompt_id="p"), record]
        data = write_records(rows, tmp_path / f"graded{number}.jsonl")
        out = tmp_path / f"judge{number}.jsonl"
        problem = (1, f"record.{field}.special_token", f"{data}:2: {field}")
        with pytest.raises(ValueError) as error:
            judge_records(load_records(data).records)
        assert (error.value.key, error.value.where) == problem[1:]
        assert token in str(error.value)  # the token it found, whichever it is
        assert refusal(verifier.main, ["build", "--graded", str(data), "--out", str(out)]) == problem
        assert not out.exists()
        assert refusal(verifier.main, ["score", "--model", str(model_dir), "--records", str(data), "--out", str(out),
                                       "--device", "cpu"]) == problem
        assert not out.exists() and not out.with_suffix(".report.json").exists()


@pytest.mark.parametrize("messages", [[{"role": "system", "content": "Solve: 2+2"}],
                                      [{"role": "system", "content": "Solve:"}, {"role": "tool", "content": "2+2"}]],
                         ids=["system-only", "system-and-tool"])  # a misspelt role ("User") is refused on reading
def test_build_and_score_refuse_messages_without_a_user_turn_naming_row_and_field(model_dir, tmp_path, messages):
    """The judge reads the last user message as the problem; without one, both verbs ended in an
    IndexError traceback."""
    first = [{"role": "user", "content": "What is 1+1?"}]
    data = write_records([graded(first, " 2", 1.0, prompt_id="p"), graded(messages, " 4", -1.0)],
                         tmp_path / "graded.jsonl")
    out = tmp_path / "judge.jsonl"
    problem = (1, "record.prompt.no_user_message", f"{data}:2: prompt")
    assert refusal(verifier.main, ["build", "--graded", str(data), "--out", str(out)]) == problem
    assert refusal(verifier.main, ["score", "--model", str(model_dir), "--records", str(data), "--out", str(out),
                                   "--device", "cpu"]) == problem
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graded.jsonl"]


# ---------------------------------------------------------------------------------------------
# P(Yes)


def independent_yes_probability(model_dir, record) -> float:
    """p(" Yes") / (p(" Yes") + p(" No")) from transformers' own loss: one unpadded forward per option."""
    from transformers import AutoModelForCausalLM

    from nemo_topr.data.tokenization import load_tokenizer, prompt_token_ids

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    prompt = prompt_token_ids(tokenizer, [judge_prompt(record)])[0]
    probabilities = []
    for option in (YES, NO):
        option_ids = tokenizer(option, add_special_tokens=False)["input_ids"]
        labels = torch.tensor([[-100] * len(prompt) + option_ids])
        with torch.no_grad():
            mean_nll = model(input_ids=torch.tensor([prompt + option_ids]), labels=labels).loss.item()
        probabilities.append(math.exp(-mean_nll * len(option_ids)))
    return probabilities[0] / sum(probabilities)


def test_yes_probability_matches_an_independent_computation(model_dir):
    from nemo_topr.data.tokenization import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    assert len(tokenizer(YES, add_special_tokens=False)["input_ids"]) > 1  # the multi-token case
    records = [graded("Question: What is 2+3?\nAnswer:", " The answer is 5.", 1.0),
               graded("Question: Tom has 3 apples and buys 4 more. How many now?\nAnswer:",
                      " 3+4=7 apples.\nThe answer is 7.", 1.0, reference="7"),
               graded("Question: What is 10-4?\nAnswer:", " 14", -1.0, reference="6")]
    batched = verifier.yes_probabilities(model_dir, records, batch_size=2)  # padded batches of unequal lengths
    expected = [independent_yes_probability(model_dir, record) for record in records]
    assert batched == pytest.approx(expected, abs=1e-6)
    assert verifier.yes_probabilities(model_dir, records, batch_size=1) == pytest.approx(batched, abs=1e-6)


def test_judge_accuracy_by_hand():
    records = [graded("p", " a", 1.0), graded("p", " b", 1.0), graded("p", " c", -1.0), graded("p", " d", -1.0)]
    report = judge_accuracy(records, [0.9, 0.2, 0.5, 0.1])  # Yes when >= 0.5: right, wrong, wrong, right
    assert (report["accuracy"], report["accuracy_on_correct"], report["accuracy_on_incorrect"]) == (0.5, 0.5, 0.5)
    assert report["mean_score_correct"] == pytest.approx(0.55)


def test_score_writes_verifier_scores_that_eval_votes_with(model_dir, tmp_path):
    records = [graded("Question: What is 2+3?\nAnswer:", f" The answer is {n}.", 1.0 if n == 5 else -1.0,
                      sample_id=i) for i, n in enumerate((5, 6, 5, 7))]
    scored = tmp_path / "scored.jsonl"
    assert verifier_main(["score", "--model", str(model_dir), "--records",
                          str(write_records(records, tmp_path / "graded.jsonl")), "--out", str(scored),
                          "--device", "cpu"]) == 0
    scores = [record.meta["verifier_score"] for record in load_records(scored).records]
    assert scores == pytest.approx(verifier.yes_probabilities(model_dir, records))
    report = json.loads(scored.with_suffix(".report.json").read_text())
    assert report["records"] == 4 and report["correct_samples"] == 2 and "replaced_verifier_scores" not in report
    # scored again (another verifier): the earlier scores are replaced in the output, and counted
    assert verifier_main(["score", "--model", str(model_dir), "--records", str(scored), "--out",
                          str(tmp_path / "again.jsonl"), "--device", "cpu"]) == 0
    assert json.loads((tmp_path / "again.report.json").read_text())["replaced_verifier_scores"] == 4
    assert evaluate.main(["--records", str(scored), "--out", str(tmp_path / "eval.json")]) == 0
    assert "weighted_maj@4" in json.loads((tmp_path / "eval.json").read_text())["metrics"]


def test_verifier_scores_flip_the_majority_vote(tmp_path):
    # three confident-looking wrong answers (6) against two the verifier trusts (5, correct)
    answers_and_scores = [(6, 0.1), (5, 0.9), (6, 0.2), (5, 0.8), (6, 0.1)]
    records = [graded("Question: What is 2+3?\nAnswer:", f" The answer is {n}.", 1.0 if n == 5 else -1.0,
                      sample_id=i) for i, (n, _) in enumerate(answers_and_scores)]
    records = [replace_meta(record, verifier_score=score) for record, (_, score) in zip(records, answers_and_scores)]
    out = tmp_path / "eval.json"
    assert evaluate.main(["--records", str(write_records(records, tmp_path / "scored.jsonl")), "--k", "5",
                          "--out", str(out)]) == 0
    metrics = json.loads(out.read_text())["metrics"]
    assert metrics["maj@5"] == 0.0  # 6 wins three votes to two
    assert metrics["weighted_maj@5"] == 1.0  # 5 wins 1.7 to 0.4


def replace_meta(record, **values):
    from dataclasses import replace

    return replace(record, meta={**record.meta, **values})


# ---------------------------------------------------------------------------------------------
# Training the verifier with the TOPR recipe


def nemo_topr(*args, module="nemo_topr.cli"):
    proc = forked.run(["-m", module, *map(str, args)], timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def mean_probability_of_the_right_judgment(scored):
    records = load_records(scored).records
    return sum(r.meta["verifier_score"] if r.reward > 0 else 1 - r.meta["verifier_score"] for r in records) / len(records)


@pytest.mark.slow
def test_the_verifier_trains_with_the_topr_recipe(model_dir, tmp_path):
    from nemo_topr.demo import build_graded_records

    # 8 GSM8K train questions, each with its gold solution and two wrong ones: 24 candidates
    graded_path = tmp_path / "graded.jsonl"
    graded_path.write_text("".join(json.dumps(row) + "\n" for row in build_graded_records(8)))
    judge, judge_scored, run_dir, exports = (tmp_path / name for name in ("judge.jsonl", "judge_scored.jsonl",
                                                                          "run", "verifier_hf"))
    nemo_topr("verifier", "build", "--graded", graded_path, "--out", judge)
    nemo_topr("verifier", "score", "--model", model_dir, "--records", graded_path, "--out", tmp_path / "before.jsonl", "--device", "cpu")
    nemo_topr("score-logprobs", "--model", model_dir, "--data", judge, "--out", judge_scored, "--seq-length", 512,
              "--device", "cpu")
    # `nemo-topr train`, then its checkpoints exported, in one process (one start-up)
    nemo_topr(exports, "--config-name", "tiny_cpu", f"hf_model={model_dir}", f"run_dir={run_dir}",
              f"dataset.train_path={judge_scored}", "dataset.epochs=2", module="nemo_topr.training.train_export")
    trained = max(exports.iterdir())  # the final iteration's
    nemo_topr("verifier", "score", "--model", trained, "--records", graded_path, "--out", tmp_path / "after.jsonl", "--device", "cpu")

    report = json.loads((run_dir / "data_report.json").read_text())
    assert (report["records_used"], report["positives"]) == (48, 24)  # both judgments of every candidate
    before, after = (json.loads((tmp_path / f"{name}.report.json").read_text()) for name in ("before", "after"))
    right = {name: mean_probability_of_the_right_judgment(tmp_path / f"{name}.jsonl") for name in ("before", "after")}
    print(f"verifier on its 24 training candidates (8 correct): accuracy {before['accuracy']:.3f} -> "
          f"{after['accuracy']:.3f}, mean P(right judgment) {right['before']:.3f} -> {right['after']:.3f}, "
          f"mean P(Yes) correct {before['mean_score_correct']:.3f} -> {after['mean_score_correct']:.3f}, "
          f"incorrect {before['mean_score_incorrect']:.3f} -> {after['mean_score_incorrect']:.3f}")
    # A random tiny model learns at least the grades' prior (2 of 3 candidates are wrong); telling
    # candidates apart needs a model that can read them (the paper: 32.6 % -> 70.9 % with Llama 3 8B).
    assert right["after"] > right["before"]
    assert after["accuracy"] >= before["accuracy"]


# `validate` of `verifier build` and `score`: every problem of a command line at once, before a record or the
# model is read, nothing written. Run in a folder holding graded records (g.jsonl), a Hugging Face model (hf)
# and a report of an earlier score (taken.report.json).
SPEC_ROWS = [
    ("build --graded g.jsonl --out j.jsonl", []),
    ("score --model hf --records g.jsonl --out s.jsonl", []),
    ("build --graded missing.jsonl --out j.jsonl", [("path.missing", "missing.jsonl: path")]),
    ("build --graded g.jsonl --out g.jsonl --overwrite", [("output.is_an_input", "g.jsonl")]),
    ("score --model hf --records g.jsonl --out taken.jsonl", [("output.exists", "--out's report")]),
    ("score --model missing --records g.jsonl --out s.json",
     [("model.no_such_directory", "--model"), ("output.records.not_jsonl", "--out")]),
]


@pytest.fixture(scope="module")
def spec_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("verifier_spec")
    (root / "g.jsonl").write_text("{}\n")
    (root / "taken.report.json").write_text("{}\n")
    placeholder_hf_model(root / "hf")
    return root


@pytest.mark.parametrize("argv, problems", SPEC_ROWS, ids=[argv for argv, _ in SPEC_ROWS])
def test_validate_names_every_problem_of_a_command_line_before_reading_and_writes_nothing(spec_inputs, argv,
                                                                                          problems, monkeypatch):
    monkeypatch.chdir(spec_inputs)
    files = sorted(spec_inputs.rglob("*"))
    megatron = {name for name in sys.modules if name.startswith(("megatron", "transformers"))}
    args = verifier.build_parser().parse_args(argv.split())
    assert [(problem.key, problem.where) for problem in verifier.validate(args.spec(args))] == problems
    assert sorted(spec_inputs.rglob("*")) == files
    assert {name for name in sys.modules if name.startswith(("megatron", "transformers"))} <= megatron
