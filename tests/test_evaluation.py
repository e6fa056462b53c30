import hashlib
import math
import string
from pathlib import Path

import pytest

from trl_rpg.evaluation import evaluate as evaluation
from trl_rpg.evaluation.evaluate import (
    BENCHMARKS,
    evaluate_benchmarks,
    evaluate_model,
    load_benchmark,
    mean_at_k,
    score_completions,
)
from trl_rpg.rewards import normalize_answer

EXPECTED_PROBLEMS = {"aime24": 30, "aime25": 30, "amc23": 40}
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared beside the repository


# ---------------------------------------------------------------------------------------------------------------------
# Bundled data
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def benchmarks():
    return {name: load_benchmark(name) for name in BENCHMARKS}


def test_benchmark_names():
    assert BENCHMARKS == {"aime24": "aime-2024.parquet", "aime25": "aime25.parquet", "amc23": "amc-23.parquet"}
    data_dir = Path(evaluation.__file__).resolve().parents[1] / "data"
    for filename in BENCHMARKS.values():
        assert (data_dir / filename).is_file()


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="shared data directory not available")
def test_bundled_files_are_byte_identical():
    data_dir = Path(evaluation.__file__).resolve().parents[1] / "data"
    for filename in BENCHMARKS.values():
        bundled = hashlib.sha256((data_dir / filename).read_bytes()).hexdigest()
        shared = hashlib.sha256((SHARED_DATA / filename).read_bytes()).hexdigest()
        assert bundled == shared, filename


@pytest.mark.parametrize("name", sorted(EXPECTED_PROBLEMS))
def test_load_benchmark(benchmarks, name):
    ds = benchmarks[name]
    n_problems = EXPECTED_PROBLEMS[name]
    assert len(ds) == n_problems * 32
    for column in ("prompt", "reward_model", "extra_info", "ground_truth", "problem_id", "sample_index"):
        assert column in ds.column_names
    problem_ids = ds["problem_id"]
    assert sorted(set(problem_ids)) == list(range(n_problems))
    assert all(problem_ids.count(p) == 32 for p in range(n_problems))
    assert sorted(ds["sample_index"]) == sorted(list(range(32)) * n_problems)
    ground_truths = ds["ground_truth"]
    assert all(isinstance(gt, str) and gt.strip() for gt in ground_truths)
    assert ground_truths == [rm["ground_truth"].strip() for rm in ds["reward_model"]]
    # one reference answer and one problem statement per problem id
    by_problem = {}
    for pid, gt, extra in zip(problem_ids, ground_truths, ds["extra_info"], strict=True):
        by_problem.setdefault(pid, set()).add((gt, extra["raw_problem"]))
    assert all(len(v) == 1 for v in by_problem.values())
    prompt = ds[0]["prompt"]
    assert len(prompt) == 1 and prompt[0]["role"] == "user"
    assert "Answer:" in prompt[0]["content"]


def test_load_benchmark_aliases_and_data_dir(tmp_path):
    assert len(load_benchmark("AIME-2024")) == 960
    (tmp_path / "amc-23.parquet").write_bytes(
        (Path(evaluation.__file__).resolve().parents[1] / "data" / "amc-23.parquet").read_bytes()
    )
    assert len(load_benchmark("amc23", data_dir=tmp_path)) == 1280
    with pytest.raises(FileNotFoundError):
        load_benchmark("aime25", data_dir=tmp_path)


def test_load_benchmark_unknown_name():
    with pytest.raises(ValueError) as excinfo:
        load_benchmark("gsm8k")
    message = str(excinfo.value)
    assert "gsm8k" in message
    for name in BENCHMARKS:
        assert name in message


# ---------------------------------------------------------------------------------------------------------------------
# Scoring and mean@k
# ---------------------------------------------------------------------------------------------------------------------


def test_score_completions():
    completions = ["Answer: 540", "Answer: 541", "no answer", [{"role": "assistant", "content": "\\boxed{0.5}"}]]
    assert score_completions(completions, ["540", "540", "540", "\\frac{1}{2}"]) == [1.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        score_completions(["Answer: 1"], ["1", "2"])
    with pytest.raises(ValueError):
        score_completions(["Answer: 1"], [None])


def test_mean_at_k_hand_made():
    # problem "a": 3/4 correct, "b": 0/4, "c": 4/4  ->  mean@4 = (0.75 + 0 + 1) / 3
    pids = ["a", "b", "c", "a", "b", "c", "a", "b", "c", "b", "c", "a"]
    scores = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    stats = mean_at_k(scores, pids)
    assert stats["k"] == 4
    assert stats["num_problems"] == 3
    assert stats["num_samples"] == 12
    assert stats["per_problem"] == {"a": 0.75, "b": 0.0, "c": 1.0}
    assert stats["mean_at_k"] == pytest.approx(1.75 / 3)
    assert stats["pass_at_k"] == pytest.approx(2 / 3)


def test_mean_at_k_uneven_and_errors():
    scores, pids = [1.0, 0.0, 1.0], [0, 0, 1]  # problem 0: 2 samples (mean 0.5), problem 1: 1 sample (mean 1)
    with pytest.raises(ValueError, match="different numbers"):
        mean_at_k(scores, pids)
    stats = mean_at_k(scores, pids, allow_uneven=True)
    assert stats["k"] is None
    assert stats["mean_at_k"] == pytest.approx(0.75)  # problems weigh equally, not samples (which would give 2/3)
    with pytest.raises(ValueError):
        mean_at_k([1.0], [0, 1])
    with pytest.raises(ValueError):
        mean_at_k([], [])


def _wrong(gt: str) -> str:
    return str(int(normalize_answer(gt)) + 1)


@pytest.mark.parametrize("name", sorted(EXPECTED_PROBLEMS))
def test_bundled_ground_truths_score_perfectly(benchmarks, name):
    ds = benchmarks[name]
    gts, pids = ds["ground_truth"], ds["problem_id"]
    right = mean_at_k(score_completions([f"Let me think.\nAnswer: {gt}" for gt in gts], gts), pids)
    assert right["k"] == 32
    assert right["num_problems"] == EXPECTED_PROBLEMS[name]
    assert right["mean_at_k"] == 1.0
    wrong = mean_at_k(score_completions([f"Answer: {_wrong(gt)}" for gt in gts], gts), pids)
    assert wrong["mean_at_k"] == 0.0
    assert wrong["pass_at_k"] == 0.0


def test_aime24_half_right(benchmarks):
    """Even rows of each problem right, odd rows wrong -> mean@32 = 0.5 exactly."""
    ds = benchmarks["aime24"]
    completions = [
        f"\\boxed{{{gt}}}" if idx % 2 == 0 else f"Answer: {_wrong(gt)}"
        for gt, idx in zip(ds["ground_truth"], ds["sample_index"], strict=True)
    ]
    stats = mean_at_k(score_completions(completions, ds["ground_truth"]), ds["problem_id"])
    assert stats["mean_at_k"] == 0.5
    assert set(stats["per_problem"].values()) == {0.5}


def test_degree_ground_truth_accepts_plain_number(benchmarks):
    gts = [gt for gt in benchmarks["aime25"]["ground_truth"] if "circ" in gt]
    assert gts, "expected AIME 2025 to contain the 336^\\circ answer"
    assert score_completions(["Answer: 336"], gts[:1]) == [1.0]


# ---------------------------------------------------------------------------------------------------------------------
# Generation with a tiny local model
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_and_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(string.printable)))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per character
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        additional_special_tokens=["<|user|>", "<|assistant|>", "<|system|>"],
    )
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    from trl_rpg.toy import build_model

    model = build_model(tokenizer, hidden_size=32, num_layers=2, num_heads=4, seed=0, intermediate_size=64,
                        num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=None,
                        tie_word_embeddings=False)
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id,
                                               eos_token_id=tokenizer.eos_token_id)  # sampling as requested
    return model, tokenizer


EXPECTED_KEYS = {
    "mean_at_k",
    "k",
    "num_problems",
    "num_samples",
    "pass_at_k",
    "per_problem",
    "mean_completion_length",
    "truncated_fraction",
    "generation",
    "completions",
    "extracted_answers",
    "ground_truths",
    "scores",
    "problem_ids",
    "completion_lengths",
}


def test_evaluate_model_tiny_random_model(tiny_model_and_tokenizer, benchmarks):
    model, tokenizer = tiny_model_and_tokenizer
    model.train()
    stats = evaluate_model(
        model, tokenizer, benchmarks["aime24"], max_new_tokens=6, num_samples=2, max_problems=3, batch_size=4
    )
    assert EXPECTED_KEYS <= set(stats)
    assert stats["k"] == 2
    assert stats["num_problems"] == 3
    assert stats["num_samples"] == 6
    assert 0.0 <= stats["mean_at_k"] <= 1.0 and math.isfinite(stats["mean_at_k"])
    assert math.isfinite(stats["mean_completion_length"]) and 0 < stats["mean_completion_length"] <= 6
    assert 0.0 <= stats["truncated_fraction"] <= 1.0
    assert len(stats["completions"]) == 6 and all(isinstance(c, str) for c in stats["completions"])
    assert stats["problem_ids"] == [0, 0, 1, 1, 2, 2]
    gold = dict(zip(benchmarks["aime24"]["problem_id"], benchmarks["aime24"]["ground_truth"], strict=True))
    assert stats["ground_truths"] == [gold[p] for p in stats["problem_ids"]]
    # state is restored
    assert model.training
    assert tokenizer.padding_side == "right"


def test_evaluate_model_is_seeded(tiny_model_and_tokenizer, benchmarks):
    model, tokenizer = tiny_model_and_tokenizer
    kwargs = {"max_new_tokens": 5, "num_samples": 1, "max_problems": 2, "batch_size": 2, "seed": 123}
    first = evaluate_model(model, tokenizer, benchmarks["amc23"], **kwargs)
    second = evaluate_model(model, tokenizer, benchmarks["amc23"], **kwargs)
    assert first["completions"] == second["completions"]
    greedy = evaluate_model(model, tokenizer, benchmarks["amc23"], temperature=0.0, **kwargs)
    assert greedy["k"] == 1 and len(greedy["completions"]) == 2


def test_evaluate_model_scores_generated_answers(tiny_model_and_tokenizer, benchmarks, monkeypatch):
    """End to end with a scripted `generate`: checks left padding, slicing of the new tokens, decoding and scoring."""
    import torch

    model, tokenizer = tiny_model_and_tokenizer
    ds = benchmarks["aime24"]
    gold_by_prompt_ids = {}
    for row in ds.select_columns(["prompt", "problem_id", "ground_truth"]):
        text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
        gold_by_prompt_ids[ids] = (row["problem_id"], row["ground_truth"])
    calls = []

    def scripted_generate(input_ids, attention_mask, max_new_tokens, pad_token_id, **kwargs):
        calls.append(input_ids.shape)
        assert (attention_mask[:, -1] == 1).all(), "prompts must be left-padded"
        rows = []
        for ids, mask in zip(input_ids, attention_mask, strict=True):
            pid, gt = gold_by_prompt_ids[tuple(ids[mask.bool()].tolist())]
            answer = gt if pid % 3 == 0 else str(int(gt) + 1)  # problems 0 and 3 right, the others wrong
            new = tokenizer(f"Thinking...\nAnswer: {answer}", add_special_tokens=False)["input_ids"]
            rows.append(new[: max_new_tokens - 1] + [tokenizer.eos_token_id])
        width = max(len(r) for r in rows)
        new_tokens = torch.tensor([r + [pad_token_id] * (width - len(r)) for r in rows], dtype=input_ids.dtype)
        return torch.cat([input_ids, new_tokens], dim=1)

    monkeypatch.setattr(model, "generate", scripted_generate)
    stats = evaluate_model(model, tokenizer, ds, max_new_tokens=64, num_samples=2, max_problems=6, batch_size=5)
    assert len(calls) == 3  # 12 rows in batches of 5
    assert stats["k"] == 2 and stats["num_problems"] == 6
    assert stats["per_problem"] == {0: 1.0, 1: 0.0, 2: 0.0, 3: 1.0, 4: 0.0, 5: 0.0}
    assert stats["mean_at_k"] == pytest.approx(2 / 6)
    assert stats["truncated_fraction"] == 0.0
    assert stats["completions"][0] == f"Thinking...\nAnswer: {stats['ground_truths'][0]}"
    assert stats["extracted_answers"][0] == stats["ground_truths"][0]


def test_evaluate_benchmarks(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    results = evaluate_benchmarks(
        model, tokenizer, names=("aime25", "amc23"), max_new_tokens=3, num_samples=1, max_problems=1, batch_size=1
    )
    assert set(results) == {"aime25", "amc23"}
    for stats in results.values():
        assert stats["num_problems"] == 1 and stats["k"] == 1
        assert math.isfinite(stats["mean_at_k"])
    with pytest.raises(ValueError):
        evaluate_benchmarks(model, tokenizer, names=("nope",), max_new_tokens=1)


def test_evaluation_scores_like_the_training_reward():
    """Benchmark scoring is the training reward's rule: the last committed answer wins, a list means any of them."""
    from trl_rpg.rewards import math_reward

    completions = [
        "We need the answer: first compute x.\nx = 6, so \\boxed{42}",  # the reported case
        "Answer: 41\nWait, that is off by one: \\boxed{42}",
        "\\boxed{42}\nso the answer: 41 is wrong",
        "Answer: 7",
    ]
    references = ["42", "42", "42", ["6", "7"]]
    assert score_completions(completions, references) == [1.0, 1.0, 1.0, 1.0]
    assert math_reward(completions, ground_truth=references) == [1.0, 1.0, 1.0, 1.0]


def test_evaluate_model_reads_the_answer_column(tiny_model_and_tokenizer, monkeypatch):
    """Rows with a plain `answer` column (the reference columns of `math_reward`) are evaluated; rows without any
    reference are refused with the columns looked for."""
    import torch

    model, tokenizer = tiny_model_and_tokenizer
    rows = [{"prompt": "1+1=", "answer": "2", "problem_id": 0}, {"prompt": "2+2=", "answer": "4", "problem_id": 1}]

    def scripted_generate(input_ids, attention_mask, max_new_tokens, pad_token_id, **kwargs):
        new = tokenizer("Answer: 2", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return torch.cat([input_ids, torch.tensor([new] * len(input_ids), dtype=input_ids.dtype)], dim=1)

    monkeypatch.setattr(model, "generate", scripted_generate)
    stats = evaluate_model(model, tokenizer, rows, max_new_tokens=16, batch_size=2)
    assert stats["ground_truths"] == ["2", "4"] and stats["scores"] == [1.0, 0.0]
    with pytest.raises(ValueError, match="ground_truth.*reward_model.*answer"):
        evaluate_model(model, tokenizer, [{"prompt": "1+1=", "solution": "2"}], max_new_tokens=4)
