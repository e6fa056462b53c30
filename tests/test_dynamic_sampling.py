"""Dynamic sampling (DAPO): zero-reward-variance groups are dropped and replaced until the batch is full."""

import json
import os
import subprocess
import sys
import threading
import zlib
from collections import Counter, defaultdict

import pytest
import torch
from _processes import free_port
from _tiny import cpu_args, save_tiny_model, tiny_dataset
from datasets import IterableDataset

from trl_rpg import RPGConfig
from trl_rpg.dynamic_sampling import sampling as ds

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dynamic"))
from _helpers import RecordingTrainer, SubsetReward, group_rewards, is_constant_prompt, reward_lookup  # noqa: E402

DDP_SCRIPT = os.path.join(os.path.dirname(__file__), "dynamic", "ddp_script.py")
G = 4


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


# ------------------------------------------------------------------------------------------------------------------
# The filter
# ------------------------------------------------------------------------------------------------------------------


def signal(rewards, weights=None, aggregation="sum_then_normalize"):
    rpf = torch.tensor(rewards, dtype=torch.float32)
    rpf = rpf.unsqueeze(-1) if rpf.dim() == 1 else rpf
    weights = torch.ones(rpf.size(1)) if weights is None else torch.tensor(weights, dtype=torch.float32)
    informative, spread = ds.group_reward_signal(rpf, weights, G, aggregation)
    return informative.tolist(), spread


def test_filter_uses_variance_not_mean():
    nan = float("nan")
    informative, spread = signal([
        1, 1, 1, 1,  # all right
        0, 0, 0, 0,  # all wrong
        0.5, 0.5, 0.5, 0.5,  # constant, non-binary: a mean-based filter (mean in (0, 1)) would keep it
        0.2, 0.2, 0.2, 0.2 + 1e-9,  # constant up to float rounding
        0, 1, 1, 1,  # one wrong: kept
        0.3, 0.31, 0.3, 0.3,  # small but real variation: kept
        nan, 1, nan, nan,  # one scored completion: no baseline signal
        nan, 1, 0, nan,  # two scored completions that differ: kept
    ])
    assert informative == [False, False, False, False, True, True, False, True]
    assert spread[:4].eq(0).all() and spread[6] == 0
    assert spread[4] == pytest.approx(0.4330127, rel=1e-5)  # population std of (0, 1, 1, 1)


def test_filter_with_several_reward_functions():
    # weighted sum: 1*f1 + 1*f2 is constant although both functions vary -> no signal under sum_then_normalize
    f1, f2 = [1, 0, 1, 0], [0, 1, 0, 1]
    rows = [[a, b] for a, b in zip(f1, f2)] + [[1, 1]] * 4
    assert signal(rows, [1.0, 1.0])[0] == [False, False]
    assert signal(rows, [1.0, 2.0])[0] == [True, False]
    # normalize_then_sum: per-function normalisation first; equal weights cancel, unequal ones do not
    f1, f2 = [1, 0, 0, 0], [0, 1, 1, 1]
    rows = [[a, b] for a, b in zip(f1, f2)] + [[5, 7]] * 4
    assert signal(rows, [1.0, 1.0], "normalize_then_sum")[0] == [False, False]
    assert signal(rows, [1.0, 2.0], "normalize_then_sum")[0] == [True, False]


def test_a_function_that_scores_nothing_does_not_unscore_the_group():
    """Two functions, the first None (NaN) for every completion, the second varying: the group is scored by the
    second and kept (under both aggregations); a group with no score at all is dropped."""
    nan = float("nan")
    rows = [[nan, r] for r in (0.0, 1.0, 0.0, 1.0)] + [[nan, nan]] * 4
    for aggregation in ("sum_then_normalize", "normalize_then_sum"):
        informative, spread = signal(rows, [1.0, 1.0], aggregation)
        assert informative == [True, False], aggregation
        assert spread[0] > 0 and spread[1] == 0


def test_selection_takes_generation_order():
    recs = [ds.GroupRecord(0, 0, False, 0.0), ds.GroupRecord(0, 1, True, 0.1), ds.GroupRecord(1, 0, True, 0.5),
            ds.GroupRecord(1, 1, False, 0.0), ds.GroupRecord(1, 2, True, 0.2), ds.GroupRecord(2, 0, False, 0.0)]
    assert [(r.round, r.group) for r in ds.select_groups(recs, 2, fill=False)] == [(0, 1), (1, 0)]
    assert [(r.round, r.group) for r in ds.select_groups(recs, 5, fill=False)] == [(0, 1), (1, 0), (1, 2)]
    # filling: the informative groups, then the earliest dropped ones (every dropped group has spread 0)
    assert [(r.round, r.group) for r in ds.select_groups(recs, 4, fill=True)] == [(0, 1), (1, 0), (1, 2), (0, 0)]
    assert [(r.round, r.group) for r in ds.select_groups(recs, 5, fill=True)] == [
        (0, 1), (1, 0), (1, 2), (0, 0), (1, 1)]


# ------------------------------------------------------------------------------------------------------------------
# Layout across processes
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size,local", [(2, 6), (2, 8), (3, 4), (4, 2)])
def test_plan_gives_every_selected_row_once_and_full_ranks(world_size, local):
    groups_per_round = world_size * local // G
    torch.manual_seed(world_size * 100 + local)
    records = [ds.GroupRecord(k, g, bool(torch.rand(()) < 0.5), 0.0) for k in range(4)
               for g in range(groups_per_round)]
    selected = ds.select_groups(records, groups_per_round, fill=True)
    plans = ds.plan_layout(selected, G, local, world_size)
    got = Counter()
    for rank, plan in enumerate(plans):
        assert len(plan.keep) + len(plan.receive) == local
        for rnd, idx in plan.keep:
            got[(rnd, rank * local + idx)] += 1
        for src, rnd, idx in plan.receive:
            assert (rnd, idx) in plans[src].send[rank]
            got[(rnd, src * local + idx)] += 1
    want = Counter((r.round, r.group * G + j) for r in selected for j in range(G))
    assert got == want  # every row of every selected group exactly once: groups stay whole
    moved = sum(len(p.receive) for p in plans)
    held = Counter((r.group * G + j) // local for r in selected for j in range(G))
    assert moved == sum(max(0, held[rank] - local) for rank in range(world_size))  # only surplus moves


def fake_round(round_index, rank, local, prompt_width, completion_width):
    """A TRL-like generation batch whose row `i` carries the marker `1000 * round + global row` everywhere."""
    rows = torch.arange(local) + rank * local
    marker = (1000 * round_index + rows).float()
    prompt_ids = torch.zeros(local, prompt_width, dtype=torch.long)
    prompt_ids[:, -1] = marker.long()
    prompt_mask = torch.zeros(local, prompt_width, dtype=torch.long)
    prompt_mask[:, -1] = 1
    completion_ids = torch.zeros(local, completion_width, dtype=torch.long)
    completion_ids[:, 0] = marker.long()
    completion_mask = torch.zeros(local, completion_width, dtype=torch.long)
    completion_mask[:, 0] = 1
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": marker, "num_items_in_batch": torch.tensor(7.0),
            "old_per_token_logps": marker.unsqueeze(1).expand(-1, completion_width).clone()}


def test_two_rank_assembly_moves_rows_and_repads():
    world_size, local = 2, 6  # 3 groups of 4 per round; group 1 spans the two ranks
    informative = [torch.tensor([False, False, True]), torch.tensor([False, True, True])]
    widths = [(3, 5), (6, 2)]
    barrier = threading.Barrier(world_size)
    mailbox = [None] * world_size
    results = [None] * world_size

    def run(rank):
        buf = ds.RoundBuffer(3, G, local, world_size, rank, fill=True)
        for k in range(2):
            buf.add_round(fake_round(k, rank, local, *widths[k]), informative[k], informative[k].float())

        def exchange(outgoing):
            mailbox[rank] = outgoing
            barrier.wait()
            out = list(mailbox)
            barrier.wait()
            return out

        results[rank] = buf.assemble(pad_token_id=0, exchange=exchange)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # selected: round 0 group 2 (rows 8..11, rank 1), round 1 groups 1 (rows 4, 5 on rank 0; 6, 7 on rank 1) and 2
    want = [8, 9, 10, 11] + [1000 + r for r in range(4, 12)]
    got = []
    # rank 1 keeps its round-0 rows and round-1 rows 6, 7 and sends round-1 rows 8..11 to rank 0, which so holds
    # round-1 rows only (prompt width 6, completion width 2); rank 1 re-pads to (6, 5)
    assert results[1][2].send == {0: [(1, 2), (1, 3), (1, 4), (1, 5)]} and len(results[0][2].receive) == 4
    for (merged, selected, plan), shape in zip(results, [(6, 2), (6, 5)]):
        assert (merged["prompt_ids"].size(1), merged["completion_ids"].size(1)) == shape
        assert "num_items_in_batch" not in merged  # recomputed by the trainer
        assert torch.equal(merged["prompt_ids"][:, -1].float(), merged["advantages"])  # prompts left-padded
        assert torch.equal(merged["completion_ids"][:, 0].float(), merged["advantages"])  # completions right
        assert torch.equal(merged["prompt_mask"].sum(1), torch.ones(local, dtype=torch.long))
        assert torch.equal(merged["old_per_token_logps"][:, 0], merged["advantages"])
        got += merged["advantages"].long().tolist()
    assert sorted(got) == want


def test_unknown_fields_are_refused():
    batch = fake_round(0, 0, 4, 2, 2)
    batch["pixel_values"] = torch.zeros(3, 3)
    buf = ds.RoundBuffer(1, G, 4, 1, 0, fill=True)
    with pytest.raises(NotImplementedError, match="pixel_values"):
        buf.add_round(batch, torch.tensor([True]), torch.tensor([1.0]))


# ------------------------------------------------------------------------------------------------------------------
# Extra prompts
# ------------------------------------------------------------------------------------------------------------------


def test_prompt_stream_layout_determinism_and_resume():
    data = tiny_dataset(10)
    streams = [ds.PromptStream(data, seed=3, shuffle=True, num_generations=G, local_batch_size=6, world_size=2,
                               rank=r) for r in range(2)]
    rows0, c0 = streams[0].draw(0)
    rows1, c1 = streams[1].draw(0)
    assert c0 == c1 == 3  # 12 rows = 3 prompts of 4
    prompts = [r["prompt"] for r in rows0 + rows1]
    assert all(prompts[i] == prompts[i - i % G] for i in range(12))  # each prompt fills 4 consecutive rows
    assert len(set(prompts[::G])) == 3
    # a fresh stream from the saved cursor continues exactly; draws cover the data set once per pass
    seen = []
    cursor = 0
    for _ in range(6):
        rows, new_cursor = streams[0].draw(cursor)
        fresh, _ = ds.PromptStream(data, 3, True, G, 6, 2, 0).draw(cursor)
        assert rows == fresh
        seen += [streams[0].indices(cursor + i, 1)[0] for i in range(3)]
        cursor = new_cursor
    assert sorted(seen[:9]) != list(range(9))  # shuffled
    assert sorted(seen[:10]) == list(range(10))  # a full pass before any repeat
    # the stream is not TRL's own permutation of the same seed
    trl_order = torch.randperm(10, generator=torch.Generator().manual_seed(3)).tolist()
    assert seen[:10] != trl_order


def test_prompt_stream_iterable_matches_map_style():
    data = tiny_dataset(5)
    iterable = IterableDataset.from_generator(lambda: iter({"prompt": p} for p in data["prompt"]))
    a = ds.PromptStream(data, 0, False, G, 8, 1, 0)
    b = ds.PromptStream(iterable, 0, False, G, 8, 1, 0)
    cursor = 0
    for _ in range(4):  # 2 prompts per round, 5 prompts: wraps around the data set
        ra, ca = a.draw(cursor)
        rb, cb = b.draw(cursor)
        assert ra == rb and ca == cb
        cursor = ca
    resumed = ds.PromptStream(iterable, 0, False, G, 8, 1, 0).draw(6)[0]
    assert resumed == a.draw(6)[0]


# ------------------------------------------------------------------------------------------------------------------
# Trainer, one process
# ------------------------------------------------------------------------------------------------------------------


def make_trainer(model, out, reward, **overrides):
    kwargs = cpu_args(out, per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4,
                      max_steps=4, dynamic_sampling=True)
    kwargs.update(overrides)
    return RecordingTrainer(model, reward_funcs=reward, args=RPGConfig(**kwargs), train_dataset=tiny_dataset(16),
                            reward=reward)


def ds_logs(trainer):
    """The `dynamic_sampling/*` metrics of each training batch, from the log line of the batch's first optimizer step
    (with `logging_steps=1`; the later steps that train on the same batch repeat its generation-time metrics)."""
    steps_per_batch = trainer.args.steps_per_generation // trainer.args.gradient_accumulation_steps
    return [{k.split("/", 1)[1]: v for k, v in h.items() if k.startswith("dynamic_sampling/")}
            for h in trainer.state.log_history
            if any(k.startswith("dynamic_sampling/") for k in h) and (h["step"] - 1) % steps_per_batch == 0]


def test_trained_batches_hold_only_groups_with_signal(tmp_path, model_path):
    # batch: 4 x 4 rows (grad accumulation 2, reused for 2 optimizer steps) = 4 groups; half the prompts are constant
    reward = SubsetReward()
    trainer = make_trainer(model_path, tmp_path, reward)
    trainer.train()
    assert len(trainer.batches) == 2
    logs = ds_logs(trainer)
    assert len(logs) == 2
    assert sum(b["stats"]["rounds"] for b in trainer.batches) > 2  # the filter did drop groups
    for batch, log in zip(trainer.batches, logs):
        table = reward_lookup(batch["calls"])
        rows = batch["rows"]
        assert len(rows) == 16  # full
        assert batch["num_items_in_batch"] == batch["completion_tokens"]
        # rows of several rounds were re-padded to one width; their stored sampling log-probs still hold (RoPE)
        assert batch["logp_gap"] < 1e-4
        by_prompt = defaultdict(list)
        for (prompt, ids), adv in zip(rows, batch["advantages"]):
            by_prompt[prompt].append((table[(prompt, ids)], adv))
        for prompt, members in by_prompt.items():
            assert not is_constant_prompt(prompt)
            assert len(members) % G == 0  # whole groups
            rewards = [r for r, _ in members]
            assert max(rewards) > min(rewards)  # non-zero variance
            assert sum(a for _, a in members) == pytest.approx(0.0, abs=1e-5)  # centred within the group
        # logged counts = what the reward function saw
        groups = [g for call in batch["calls"] for g in group_rewards(call, G)]
        constant = sum(max(g) == min(g) for g in groups)
        assert log["rounds"] == len(batch["calls"])
        assert log["groups_generated"] == len(groups)
        assert log["groups_kept"] == len(groups) - constant >= 4
        assert log["frac_filtered"] == pytest.approx(constant / len(groups))
        assert log["exhausted"] == 0 and log["groups_trained_without_signal"] == 0
        # a round stops as soon as the batch is full
        kept_before_last = sum(max(g) > min(g) for call in batch["calls"][:-1] for g in group_rewards(call, G))
        assert kept_before_last < 4


def test_cap_raise_stops_within_the_cap(tmp_path, model_path):
    reward = SubsetReward(constant_everywhere=True)  # 0.5 for everything: nothing can be learnt
    trainer = make_trainer(model_path, tmp_path, reward, dynamic_sampling_max_rounds=3,
                           dynamic_sampling_on_exhausted="raise")
    with pytest.raises(RuntimeError, match=r"dynamic_sampling_max_rounds=3.*0 of the 4 groups.*12 groups generated"):
        trainer.train()
    assert len(reward.calls) == 3


def test_cap_train_fills_and_logs(tmp_path, model_path):
    reward = SubsetReward(constant_everywhere=True)
    trainer = make_trainer(model_path, tmp_path, reward, dynamic_sampling_max_rounds=3,
                           rpg_require_learning_signal=True)
    with pytest.raises(RuntimeError, match=r"none of the 4 optimizer steps carried a learning signal \(4 steps: zero "
                                           r"reward spread in every group\)"):  # it trained, on nothing
        trainer.train()
    assert len(reward.calls) == 3 * 2  # two training batches, 3 rounds each
    for batch, log in zip(trainer.batches, ds_logs(trainer)):
        assert len(batch["rows"]) == 16
        assert batch["advantages"] == [0.0] * 16  # filler groups carry no policy-gradient signal
        assert log == {"rounds": 3, "groups_generated": 12, "groups_kept": 0, "frac_filtered": 1.0,
                       "groups_trained_without_signal": 4, "exhausted": 1,
                       "exhausted_total": log["exhausted_total"]}
    assert [log["exhausted_total"] for log in ds_logs(trainer)] == [1, 2]
    assert trainer.state.global_step == 4


def test_cap_train_keeps_the_informative_groups(tmp_path, model_path):
    reward = SubsetReward()
    trainer = make_trainer(model_path, tmp_path, reward, dynamic_sampling_max_rounds=1, max_steps=2)
    trainer.train()
    (batch,), (log,) = trainer.batches, ds_logs(trainer)
    groups = group_rewards(batch["calls"][0], G)
    kept = sum(max(g) > min(g) for g in groups)
    assert log["rounds"] == 1 and log["groups_kept"] == kept
    assert log["groups_trained_without_signal"] == 4 - kept and log["exhausted"] == float(kept < 4)
    assert sorted(batch["rows"]) == sorted((p, ids) for p, ids, _ in batch["calls"][0])  # the one round, all of it


def test_reference_logps_and_group_scaling_pass_through(tmp_path, model_path):
    reward = SubsetReward()
    trainer = make_trainer(model_path, tmp_path, reward, max_steps=2, beta=0.05, rpg_reference="initial",
                           scale_rewards="group", mask_truncated_completions=True)
    trainer.train()
    (batch,) = trainer.batches
    assert len(batch["rows"]) == 16 and batch["logp_gap"] < 1e-4
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    by_prompt = defaultdict(list)
    for (prompt, _), adv in zip(batch["rows"], batch["advantages"]):
        by_prompt[prompt].append(adv)
    assert all(not is_constant_prompt(p) and max(a) > min(a) for p, a in by_prompt.items())


def test_metric_names_the_reward_function_whose_spread_decides(tmp_path, model_path):
    """DAPO filters on accuracy: with an accuracy reward plus a length-like penalty, a group that is all right (or all
    wrong) but differs in penalty must be dropped when `dynamic_sampling_metric` names the accuracy reward, and is
    kept when the weighted total decides (the default)."""

    def penalty(completion_ids, **kwargs):  # differs between the completions of a group
        return [-(zlib.crc32(bytes(str(list(ids)), "utf8")) % 7) / 10 for ids in completion_ids]

    trained_constant = {}
    for metric in (None, "subset_reward"):
        reward = SubsetReward()
        args = RPGConfig(**cpu_args(tmp_path / str(metric), per_device_train_batch_size=4,
                                    gradient_accumulation_steps=2, steps_per_generation=4, max_steps=4,
                                    dynamic_sampling=True, dynamic_sampling_metric=metric))
        trainer = RecordingTrainer(model_path, reward_funcs=[reward, penalty], args=args,
                                   train_dataset=tiny_dataset(16), reward=reward)
        trainer.train()
        trained_constant[metric] = sum(is_constant_prompt(p) for b in trainer.batches for p, _ in b["rows"])
    assert trained_constant["subset_reward"] == 0  # filtered on the accuracy reward alone
    assert trained_constant[None] > 0  # the total varies with the penalty: all-right groups were kept


def test_metric_must_name_a_reward_function(tmp_path, model_path):
    args = RPGConfig(**cpu_args(tmp_path, dynamic_sampling=True, dynamic_sampling_metric="accuracy"))
    with pytest.raises(ValueError, match=r"`dynamic_sampling_metric`='accuracy'.*\['subset_reward'\]"):
        RecordingTrainer(model_path, reward_funcs=SubsetReward(), args=args, train_dataset=tiny_dataset(16),
                         reward=SubsetReward())


def test_disabled_is_plain_grpo_batching(tmp_path, model_path):
    reward = SubsetReward()
    trainer = make_trainer(model_path, tmp_path, reward, dynamic_sampling=False, max_steps=2)
    trainer.train()
    assert len(reward.calls) == 1 and not ds_logs(trainer)
    assert ds.STATE_KEY not in trainer.state.stateful_callbacks


def test_resume_continues_the_prompt_stream(tmp_path, model_path):
    # 4 groups per batch, half the prompts constant: the first batch needs extra prompts from the stream
    overrides = dict(per_device_train_batch_size=8, gradient_accumulation_steps=1, steps_per_generation=2,
                     save_strategy="steps", save_steps=2)
    full = make_trainer(model_path, tmp_path / "full", SubsetReward(), **overrides)
    full.train()
    with open(tmp_path / "full" / "checkpoint-2" / "trainer_state.json") as f:
        saved = json.load(f)["stateful_callbacks"][ds.STATE_KEY]
    first_rounds = int(full.batches[0]["stats"]["rounds"])
    assert first_rounds > 1
    assert saved == {"prompts_drawn": (first_rounds - 1) * 4, "exhausted_batches": 0}
    final_path = tmp_path / "full" / "checkpoint-4" / "trainer_state.json"
    final = json.loads(final_path.read_text())["stateful_callbacks"][ds.STATE_KEY]
    second_rounds = int(full.batches[1]["stats"]["rounds"])
    assert final["prompts_drawn"] == (first_rounds - 1 + second_rounds - 1) * 4  # the cursor carries on

    resumed = make_trainer(model_path, tmp_path / "full", SubsetReward(), **overrides)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    assert len(resumed.batches) == 1
    assert resumed.batches[0]["rows"] == full.batches[1]["rows"]
    assert json.loads(final_path.read_text())["stateful_callbacks"][ds.STATE_KEY] == final
    for (n, a), b in zip(full.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=n)


# ------------------------------------------------------------------------------------------------------------------
# Two processes (DDP on CPU, gloo)
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.distributed
def test_two_processes_stay_in_step(tmp_path, model_path):
    out = tmp_path / "ddp"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # `accelerate launch --cpu --num_processes 2` wants MPI for several CPU processes; torchrun (or, equivalently,
    # `accelerate launch --multi_gpu --num_processes 2` with `use_cpu=True` in the config) sets up gloo directly
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), DDP_SCRIPT, model_path, str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.load(open(out / f"rank{r}.json")) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["param_sum"] == ranks[1]["param_sum"]  # DDP kept the replicas identical
    assert ranks[0]["param_abs_sum"] == ranks[1]["param_abs_sum"]
    assert ranks[0]["logs"] == ranks[1]["logs"] and len(ranks[0]["logs"]) == 2  # 6 steps, 3 per generation batch
    local = 6  # 2 rows x 3 steps per generation; 2 processes -> 3 groups of 4 per batch, group 1 spans ranks
    for k, log in enumerate(ranks[0]["logs"]):
        log = {key.split("/", 1)[1]: value for key, value in log.items()}
        b0, b1 = ranks[0]["batches"][k], ranks[1]["batches"][k]
        assert len(b0["calls"]) == len(b1["calls"]) == log["rounds"]  # same rounds on both ranks
        assert len(b0["rows"]) == len(b1["rows"]) == local
        assert b0["stats"]["rows_sent"] + b1["stats"]["rows_sent"] == (
            b0["stats"]["rows_received"] + b1["stats"]["rows_received"])
        # global rows of each round: rank 0's then rank 1's; groups of 4 consecutive rows
        rounds = [c0 + c1 for c0, c1 in zip(b0["calls"], b1["calls"])]
        groups = [g for call in rounds for g in group_rewards(call, G)]
        constant = sum(max(g) == min(g) for g in groups)
        assert log["groups_generated"] == len(groups) and log["groups_kept"] == len(groups) - constant >= 3
        assert log["frac_filtered"] == pytest.approx(constant / len(groups))
        table = reward_lookup(rounds)
        by_prompt = defaultdict(list)
        for prompt, ids in map(tuple, b0["rows"] + b1["rows"]):
            by_prompt[prompt].append(table[(prompt, tuple(ids))])
        for prompt, rewards in by_prompt.items():
            assert not is_constant_prompt(prompt)
            assert len(rewards) % G == 0 and max(rewards) > min(rewards)
        total_tokens = b0["completion_tokens"] + b1["completion_tokens"]
        assert b0["num_items_in_batch"] == b1["num_items_in_batch"] == total_tokens


@pytest.mark.parametrize("text", ["None", "none"])
def test_metric_none_on_the_command_line_is_none(text):
    """`--dynamic_sampling_metric None` reaches the config as the text 'None': it means the weighted total."""
    from trl_rpg.cli import make_train_parser

    _, args, *_ = make_train_parser().parse_args_and_config(["--output_dir", "unused", "--use_cpu", "True",
                                                             "--dynamic_sampling", "True",
                                                             "--dynamic_sampling_metric", text])
    assert args.dynamic_sampling_metric is None
    _, args, *_ = make_train_parser().parse_args_and_config(
        ["--output_dir", "unused", "--use_cpu", "True", "--dynamic_sampling_metric", "math_reward"])
    assert args.dynamic_sampling_metric == "math_reward"



# ------------------------------------------------------------------------------------------------------------------
# The round loop, with a scripted generator (no model)
# ------------------------------------------------------------------------------------------------------------------


def scripted_sampler(metric=None, names=("f",), max_rounds=8, on_exhausted="train", data=16):
    """A one-process `DynamicSampler` over prompts "p0".."p{data-1}" (stream in data-set order)."""
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": [f"p{i}" for i in range(data)]})
    return ds.DynamicSampler(
        num_generations=G, max_rounds=max_rounds, on_exhausted=on_exhausted, metric=metric,
        reward_func_names=list(names), reward_weights=torch.ones(len(names)), aggregation="sum_then_normalize",
        pad_token_id=0, dataset=dataset, seed=0, shuffle=False,
        collectives=ds.Collectives(1, 0, "cpu", lambda obj: [obj], lambda t: t))


def scripted_generation(reward):
    """`generate_and_score` for `DynamicSampler.collect`: row j of the prompt "pK" gets `reward(K, j % G)` (one
    function) and carries K in its ids; records the prompts of every round."""
    calls = []

    def generate_and_score(rows):
        prompts = [int(r["prompt"][1:]) for r in rows]
        calls.append(prompts[::G])
        marker = torch.tensor(prompts)
        batch = {"prompt_ids": marker.view(-1, 1), "prompt_mask": torch.ones(len(rows), 1, dtype=torch.long),
                 "completion_ids": marker.view(-1, 1), "completion_mask": torch.ones(len(rows), 1, dtype=torch.long),
                 "advantages": torch.zeros(len(rows))}
        rewards = torch.tensor([reward(k, j % G) for j, k in enumerate(prompts)], dtype=torch.float32).view(
            len(rows), -1)
        return batch, rewards

    return generate_and_score, calls


def rows_of(*prompts):
    return [{"prompt": f"p{k}"} for k in prompts for _ in range(G)]


def even_constant(k, j):  # the even prompts' groups are constant, the odd ones' vary
    return 1.0 if k % 2 == 0 else float(j)


def test_metric_naming_the_second_reward_function_reads_its_column():
    rewards = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0],  # group 0: a varies, b constant
                            [2.0, 0.0], [2.0, 1.0], [2.0, 0.0], [2.0, 1.0]])  # group 1: a constant, b varies
    expected = {"b": [False, True], "a": [True, False], None: [True, True]}
    for metric, want in expected.items():
        informative, _ = scripted_sampler(metric, names=("a", "b")).signal(rewards)
        assert informative.tolist() == want, metric


def test_prompt_stream_continues_across_batches_and_on_resume():
    """Two batches (2 groups each) that both need extra rounds: the second draws the prompts after the first's, the
    saved cursor counts every prompt drawn, and a sampler resumed from the first batch's saved state builds the
    same second batch as the uninterrupted one."""
    sampler = scripted_sampler()
    generate, calls = scripted_generation(even_constant)
    first, state, stats, _ = sampler.collect(rows_of(10, 12), generate, {})
    assert calls == [[10, 12], [0, 1], [2, 3]] and stats["rounds"] == 3
    assert state == {"prompts_drawn": 4, "exhausted_batches": 0}
    saved = json.loads(json.dumps(state))
    second, state, stats, _ = sampler.collect(rows_of(14, 8), generate, state)
    assert calls[3:] == [[14, 8], [4, 5], [6, 7]]  # new prompts, not the first batch's again
    assert state == {"prompts_drawn": 8, "exhausted_batches": 0}
    assert first["prompt_ids"].view(-1).tolist() == [1] * G + [3] * G
    assert second["prompt_ids"].view(-1).tolist() == [5] * G + [7] * G
    generate, resumed_calls = scripted_generation(even_constant)
    resumed, resumed_state, _, _ = scripted_sampler().collect(rows_of(14, 8), generate, saved)
    assert resumed_calls == calls[3:] and resumed_state == state
    assert torch.equal(resumed["prompt_ids"], second["prompt_ids"])


def test_exhausted_batch_is_topped_up_with_the_earliest_dropped_groups():
    """Nothing varies: the batch trains on the first round's groups (the batch TRL handed over), not a later one."""
    sampler = scripted_sampler(max_rounds=3)
    generate, calls = scripted_generation(lambda k, j: 0.5)
    batch, state, stats, _ = sampler.collect(rows_of(10, 12), generate, {})
    assert calls == [[10, 12], [0, 1], [2, 3]]
    assert stats["exhausted"] == 1 and stats["groups_trained_without_signal"] == 2
    assert batch["prompt_ids"].view(-1).tolist() == [10] * G + [12] * G


def test_rounds_without_a_kept_group_warn(caplog):
    """A reward that never varies with a large `dynamic_sampling_max_rounds`: a warning after 8 rounds in a row
    without a kept group (then at 16, 32), naming the count and what to check; none within the default cap."""
    import logging

    generate, calls = scripted_generation(lambda k, j: 0.5)
    with caplog.at_level(logging.WARNING, logger="trl_rpg.dynamic_sampling.sampling"):
        scripted_sampler(max_rounds=40).collect(rows_of(0, 1), generate, {})
    messages = [r.getMessage() for r in caplog.records if r.name == "trl_rpg.dynamic_sampling.sampling"]
    assert len(calls) == 40 and len(messages) == 3
    assert [m.split("the last ")[1].split(" ")[0] for m in messages] == ["8", "16", "32"]
    assert "dynamic_sampling_max_rounds=40" in messages[0] and "Check the reward functions" in messages[0]
    assert "the weighted total of the reward functions" in messages[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_rpg.dynamic_sampling.sampling"):
        scripted_sampler(max_rounds=8).collect(rows_of(0, 1), generate, {})  # the caller reports an exhausted batch
        # a kept group resets the count: 7 idle rounds, then signal, then 7 idle ones
        schedule = iter([0.5] * 7 * 2 * G + [0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0] + [0.5] * 7 * 2 * G)
        scripted_sampler(max_rounds=15).collect(rows_of(0, 1), scripted_generation(lambda k, j: next(schedule))[0],
                                                {})
    assert not [r for r in caplog.records if r.name == "trl_rpg.dynamic_sampling.sampling"]
