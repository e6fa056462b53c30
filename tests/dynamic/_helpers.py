"""Shared pieces of the dynamic-sampling tests (`tests/test_dynamic_sampling.py` and the 2-process script)."""

import zlib

import torch

from trl_rpg import RPGTrainer


def is_constant_prompt(prompt: str) -> bool:
    """The known subset whose reward is constant: prompts starting with an even digit (half of `tiny_dataset`)."""
    return int(prompt[0]) % 2 == 0


class SubsetReward:
    """Reward 1.0 on the constant subset (every completion right); elsewhere a pseudo-random score in [0, 1) that a
    sampled group almost never repeats. `constant_everywhere=True` makes every group constant (0.5: a non-binary
    value, which a filter on the group mean would not catch). Records every call."""

    def __init__(self, constant_everywhere: bool = False):
        self.constant_everywhere = constant_everywhere
        self.calls: list[list[tuple[str, tuple, float]]] = []
        self.__name__ = "subset_reward"

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        out = []
        for prompt, ids in zip(prompts, completion_ids):
            if self.constant_everywhere:
                out.append(0.5)
            elif is_constant_prompt(prompt):
                out.append(1.0)
            else:
                out.append((zlib.crc32(bytes(str(list(ids)), "utf8")) % 1000) / 1000)
        self.calls.append([(p, tuple(ids), r) for p, ids, r in zip(prompts, completion_ids, out)])
        return out


class RecordingTrainer(RPGTrainer):
    """Records each training batch handed to TRL's buffer, with the reward calls that produced it."""

    def __init__(self, *args, reward: SubsetReward, **kwargs):
        super().__init__(*args, **kwargs)
        self.reward = reward
        self.batches = []
        self.collect_stats = None  # the statistics DynamicSampler.collect returned for the last batch
        if self.dynamic_sampler is not None:
            collect = self.dynamic_sampler.collect

            def recording_collect(*args, **kwargs):
                result = collect(*args, **kwargs)
                self.collect_stats = result[2]
                return result

            self.dynamic_sampler.collect = recording_collect

    def _generate_and_score_completions(self, inputs):
        first_call = len(self.reward.calls)
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            tok = self.processing_class
            rows = []
            for i in range(output["prompt_ids"].size(0)):
                p = output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist()
                c = output["completion_ids"][i][output["completion_mask"][i].bool()].tolist()
                rows.append(("".join(tok.convert_ids_to_tokens(p)), tuple(c)))
            self.batches.append({
                "logp_gap": self._stored_logp_gap(output),
                "rows": rows, "advantages": output["advantages"].tolist(),
                "num_items_in_batch": float(output["num_items_in_batch"]),
                "completion_tokens": float(output["completion_mask"].sum()),
                "calls": self.reward.calls[first_call:],
                "stats": dict(self.collect_stats or {}),
            })
        return output

    def _stored_logp_gap(self, output):
        """Max |stored sampling log-prob - log-prob of the assembled (re-padded) batch| over completion tokens."""
        if "old_per_token_logps" not in output:
            return None
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, mask, output["completion_ids"].size(1), batch_size=ids.size(0))
        gap = (logps - output["old_per_token_logps"]).abs() * output["completion_mask"]
        return float(gap.max())


def reward_lookup(calls):
    """(prompt, completion ids) -> reward, over reward calls."""
    table = {}
    for call in calls:
        for prompt, ids, r in call:
            table[(prompt, tuple(ids))] = r
    return table


def group_rewards(call, num_generations):
    """The reward lists of the groups of one reward call (rows of one process, groups contiguous)."""
    return [[r for _, _, r in call[i:i + num_generations]] for i in range(0, len(call), num_generations)]
