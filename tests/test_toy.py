"""Fast tests for the bundled toy task, tokenizer and tiny model (``trl_rpg.toy.task``)."""

import pytest
import torch

from trl_rpg.toy import task as toy


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """One intra-op thread: these tiny models gain nothing from more, and oversubscribed cores slow them a lot."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tokenizer():
    return toy.build_tokenizer()


@pytest.fixture(scope="module")
def warm_model(toy_model_dir):
    """The full default warm-up (what the demo uses), built once per session (conftest's `toy_model_dir`)."""
    return toy.build_toy_model(toy_model_dir, seed=0)


def test_tokenizer_round_trips_task_text(tokenizer):
    ds = toy.make_dataset(16, seed=0, split="train")
    for messages in ds["prompt"]:
        expr = messages[0]["content"]
        for text in (expr, toy.worked_solution(expr), toy.worked_solution(expr, slip_rate=1.0)):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert len(ids) == len(text)  # one token per character
            assert tokenizer.unk_token_id not in ids
            assert tokenizer.decode(ids) == text
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token_id is not None and tokenizer.eos_token_id is not None
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


def test_chat_template(tokenizer):
    prompt = [{"role": "user", "content": "13+8-5=?"}]
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    assert text == f"{toy.BOS_TOKEN}{toy.USER_TOKEN}13+8-5=?{toy.ASSISTANT_TOKEN}"
    ids = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True, return_dict=True)
    assert tokenizer.decode(ids["input_ids"], skip_special_tokens=True) == "13+8-5=?"
    assert ids["input_ids"][-1] == tokenizer.convert_tokens_to_ids(toy.ASSISTANT_TOKEN)
    # A full conversation ends the assistant turn with eos, and the prompt is a prefix of it.
    full = tokenizer.apply_chat_template(
        prompt + [{"role": "assistant", "content": "13+8=21,21-5=16"}], tokenize=False
    )
    assert full == text + "13+8=21,21-5=16" + tokenizer.eos_token


def test_tokenizer_save_load(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "19+7=26,26-9=17"
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.chat_template == tokenizer.chat_template
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.padding_side) == (
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        "left",
    )


def test_splits_are_disjoint_and_answers_correct():
    pools = toy.split_problems()
    assert pools["train"] and pools["test"]
    assert not set(pools["train"]) & set(pools["test"])
    assert len(pools["train"]) + len(pools["test"]) == len(toy.all_problems())
    train = toy.make_dataset(3000, seed=1, split="train")
    test = toy.make_dataset(500, seed=2, split="test")
    train_q = {m[0]["content"] for m in train["prompt"]}
    test_q = {m[0]["content"] for m in test["prompt"]}
    assert not train_q & test_q
    assert len(test_q) == 500  # sampled without replacement while the pool allows
    for messages, answer in zip(test["prompt"], test["answer"]):
        assert len(messages) == 1 and messages[0]["role"] == "user"
        expr = messages[0]["content"]
        assert expr.endswith("=?")
        assert answer == str(eval(expr[:-2]))  # plain integer arithmetic, left to right
    # Deterministic for a seed, different across seeds.
    assert toy.make_dataset(50, seed=3)["prompt"] == toy.make_dataset(50, seed=3)["prompt"]
    assert toy.make_dataset(50, seed=3)["prompt"] != toy.make_dataset(50, seed=4)["prompt"]
    with pytest.raises(ValueError):
        toy.make_dataset(5, split="validation")


def test_worked_solution_and_teacher_slips():
    assert toy.worked_solution("13+8-5") == "13+8=21,21-5=16"
    assert toy.worked_solution("7+5-3") == "7+5=12,12-3=9"
    # The imperfect teacher only ever errs on carry/borrow steps.
    assert toy.worked_solution("11+2-1", slip_rate=1.0) == "11+2=13,13-1=12"
    assert toy.worked_solution("7+5-3", slip_rate=1.0) == "7+5=2,2-3=1"
    assert toy.worked_solution("12-3+1", slip_rate=1.0) == "12-3=11,11+1=12"


def test_reward_string_and_chat_formats():
    answers = ["16", "16", "16", "16", "16", "16"]
    strings = ["13+8=21,21-5=16", "13+8=21,21-5=15", "", "13+8=21,21-5=", "16 is the answer", "=16"]
    assert toy.toy_reward(strings, answers) == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    chats = [[{"role": "assistant", "content": s}] for s in strings]
    assert toy.toy_reward(chats, answers) == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    # Extra dataset columns arrive as kwargs (TRL passes prompts, completion_ids, ...).
    assert toy.toy_reward(["7+5=12,12-3=9"], ["9"], prompts=[[{"role": "user", "content": "7+5-3=?"}]]) == [1.0]
    # The reference solutions of a whole split earn full reward.
    ds = toy.make_dataset(200, seed=0, split="test")
    sols = [toy.worked_solution(m[0]["content"]) for m in ds["prompt"]]
    assert toy.toy_reward(sols, ds["answer"]) == [1.0] * 200


def test_build_model_forward(tokenizer):
    model = toy.build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    batch = tokenizer(["13+8-5=?", "1+1-1=?"], return_tensors="pt", padding=True, add_special_tokens=False)
    out = model(**batch)
    assert out.logits.shape == (2, batch["input_ids"].shape[1], len(tokenizer))
    assert torch.isfinite(out.logits).all()
    # Same seed -> same weights; different seed -> different weights.
    again = toy.build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    other = toy.build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=1)
    w = model.model.embed_tokens.weight
    assert torch.equal(w, again.model.embed_tokens.weight)
    assert not torch.equal(w, other.model.embed_tokens.weight)


def test_build_toy_model_deterministic_and_cached(tmp_path):
    kw = {"seed": 3, "sft_steps": 5, "model_kwargs": {"hidden_size": 32, "num_layers": 1, "num_heads": 2}}
    m1, _ = toy.build_toy_model(**kw)
    m2, _ = toy.build_toy_model(**kw)
    p1, p2 = m1.state_dict(), m2.state_dict()
    assert p1.keys() == p2.keys()
    assert all(torch.equal(p1[k], p2[k]) for k in p1)
    fresh = toy.build_model(toy.build_tokenizer(), seed=3, **kw["model_kwargs"])
    assert not torch.equal(fresh.model.embed_tokens.weight, m1.model.embed_tokens.weight)  # SFT changed it

    m3, t3 = toy.build_toy_model(output_dir=tmp_path, **kw)
    assert (tmp_path / "config.json").exists() and (tmp_path / "tokenizer_config.json").exists()
    m4, t4 = toy.build_toy_model(output_dir=tmp_path, **kw)  # loaded from the cache
    p3, p4 = m3.state_dict(), m4.state_dict()
    assert all(torch.equal(p3[k], p4[k]) for k in p3)
    assert t4("12+3=15")["input_ids"] == t3("12+3=15")["input_ids"]
    assert t4.chat_template == t3.chat_template


def test_full_warmup_is_partially_right(warm_model):
    model, tokenizer = warm_model
    test = toy.make_dataset(toy.EVAL_NUM_PROBLEMS, seed=toy.EVAL_SEED, split="test")
    acc = toy.evaluate_accuracy(model, tokenizer, test, max_new_tokens=toy.EVAL_MAX_NEW_TOKENS)
    # measured seed 0: 0.400 here, 0.420 on another machine; seeds 0-7 here 0.396-0.430, seed 2 elsewhere 0.528. The
    # bounds sit 0.2 and 0.12 outside that range: they catch a warm-up that does nothing (~0) or learns the task
    # outright (RL would have nothing to do), not the spread between machines
    assert 0.2 < acc < 0.65, acc
    # Sampled completions (what RL sees) are right sometimes and wrong sometimes.
    torch.manual_seed(0)
    completions = toy.generate_completions(model, tokenizer, test.select(range(128)), greedy=False)
    rewards = toy.toy_reward(completions, test.select(range(128))["answer"])
    assert 0.0 < sum(rewards) < len(rewards)


def test_grpo_trainer_smoke_with_recommended_args(tmp_path):
    """The toy pieces plug into TRL's GRPOTrainer with the recommended config (2 tiny steps)."""
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = toy.build_toy_model(
        output_dir=tmp_path / "model", seed=0, sft_steps=5, model_kwargs={"hidden_size": 32, "num_heads": 2}
    )
    args = {
        **toy.RECOMMENDED_RL_ARGS,
        "output_dir": str(tmp_path / "out"),
        "max_steps": 2,
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "beta": 1e-4,  # exercises the reference model, loaded from the saved warm-up
        "disable_tqdm": True,
    }
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=toy.toy_reward,
        args=GRPOConfig(**args),
        train_dataset=toy.make_dataset(32, seed=0),
    )
    trainer.train()
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert trainer.state.global_step == 2
    assert logged and all(0.0 <= h["reward"] <= 1.0 for h in logged)
    assert all(h["completions/max_length"] <= toy.MAX_COMPLETION_LENGTH for h in logged)
