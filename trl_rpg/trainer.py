"""`RPGTrainer`: a drop-in replacement for TRL's `GRPOTrainer` that trains with RPG objectives."""

from __future__ import annotations

import json
import logging
import os
import textwrap

import torch
from accelerate.utils import is_peft_model
from torch import nn
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from . import _compat
from .config import RPGConfig
from .objectives import rpg_per_token_loss
from .validation import checked_reward_function, validate_train_dataset

logger = logging.getLogger(__name__)

CHECKPOINT_MARKER = "rpg_checkpoint_complete.json"
STATE_FILE = "rpg_state.json"
REFERENCE_FILE = "rpg_reference.pt"
BUFFER_FILE = "rpg_generation_buffer_rank{rank}.pt"

_RPG_CITATION = textwrap.dedent("""\
    @inproceedings{zhang2026rpg,
        title        = {{On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning}},
        author       = {Yifan Zhang and Yifeng Liu and Huizhuo Yuan and Quanquan Gu and Andrew Chi-Chih Yao},
        booktitle    = {The Fourteenth International Conference on Learning Representations},
        year         = 2026,
        eprint       = {arXiv:2505.17508},
    }""")


class RPGTrainer(GRPOTrainer):
    """Trainer for Regularized Policy Gradient (RPG), a subclass of [`~trl.GRPOTrainer`] with the same arguments.

    Swap `GRPOTrainer` for `RPGTrainer` (and `GRPOConfig` for `RPGConfig`) and a GRPO script trains with RPG. A plain
    `GRPOConfig` is accepted and upgraded to an [`RPGConfig`]: GRPO fields keep their values, RPG fields get RPG
    defaults. See `RPGConfig` for the objective, clip and reference-policy settings.
    """

    _tag_names = ["trl", "rpg"]
    _name = "RPG"
    _paper = {
        "title": "On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning",
        "id": "2505.17508",
        "citation": _RPG_CITATION,
    }

    def __init__(self, model, reward_funcs=None, args: GRPOConfig | None = None, *positional, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model") or "model"
            args = RPGConfig(f"{str(name).rstrip('/').split('/')[-1]}-RPG")
        elif not isinstance(args, RPGConfig):
            if not isinstance(args, GRPOConfig):
                raise ValueError(f"`args` must be an RPGConfig or a GRPOConfig, got {type(args).__name__}.")
            args = RPGConfig.from_grpo_config(args)

        train_dataset = positional[0] if positional else kwargs.get("train_dataset")
        if kwargs.get("environment_factory") is None:
            validate_train_dataset(train_dataset)  # before any model is loaded

        # TRL's `self.beta` decides whether a reference model exists and whether reference log-probs are computed.
        # With rpg_reference="sampling" the reference is the sampler itself: TRL must build and query none.
        self.rpg_beta = args.beta
        if args.rpg_reference == "sampling":
            args.beta = 0.0
        try:
            super().__init__(model, reward_funcs, args, *positional, **kwargs)
        finally:
            args.beta = self.rpg_beta

        self.reward_funcs = [f if isinstance(f, nn.Module) else checked_reward_function(f, name)
                             for f, name in zip(self.reward_funcs, self.reward_func_names)]

        self._rpg_ref_version = 0  # bumped at each reference update; stale buffered reference log-probs are redone
        self._rpg_ref_updates = 0
        self._rpg_kl_ema: float | None = None
        self._rpg_kl_window = torch.zeros(2, dtype=torch.float64)  # divergence*tokens, tokens within one step
        self._rpg_skipped_steps = 0
        if args.rpg_reference in ("periodic", "adaptive"):
            self._rpg_add_reference_adapter()
            self.add_callback(_ReferenceScheduleCallback(self))
        self.add_callback(_NonFiniteGradientGuard(self))

    # ------------------------------------------------------------------------------------------------------------
    # Reference policy
    # ------------------------------------------------------------------------------------------------------------

    def _rpg_add_reference_adapter(self):
        """With PEFT, a moving reference is a frozen copy of the adapter ("ref"), not a second model."""
        model = self.accelerator.unwrap_model(self.model)
        if not is_peft_model(model) or "ref" in model.peft_config:
            return
        model.add_adapter("ref", model.peft_config["default"])
        for name, param in model.named_parameters():
            if ".ref." in name:
                param.requires_grad_(False)
        _copy_parameters(*self._rpg_adapter_pairs())

    def _rpg_adapter_pairs(self):
        model = self.accelerator.unwrap_model(self.model)
        named = dict(model.named_parameters())
        source = [p for n, p in named.items() if ".default." in n and n.replace(".default.", ".ref.") in named]
        target = [named[n.replace(".default.", ".ref.")] for n, p in named.items()
                  if ".default." in n and n.replace(".default.", ".ref.") in named]
        return nn.ParameterList(source), nn.ParameterList(target)

    def _rpg_reference_parameters(self) -> list[nn.Parameter]:
        """The parameters that hold the moving reference: the reference model, or the "ref" adapter."""
        if self.ref_model is not None:
            return list(self.ref_model.parameters())
        return list(self._rpg_adapter_pairs()[1])

    def update_reference(self) -> None:
        """pi_ref <- pi_theta (paper section 5, "iterative reference updates"); ZeRO-3-safe."""
        model = self.accelerator.unwrap_model(self.model)
        if self.ref_model is not None:
            _copy_parameters(model.parameters(), self.ref_model.parameters())
        elif is_peft_model(model):
            _copy_parameters(*self._rpg_adapter_pairs())
        else:  # pragma: no cover - guarded by RPGConfig (beta > 0 for non-sampling references)
            raise RuntimeError("No reference to update: rpg_reference needs beta > 0.")
        self._rpg_ref_version += 1
        self._rpg_ref_updates += 1
        self._rpg_kl_ema = None

    def _rpg_reference_logps(self, inputs, logits_to_keep):
        """Reference log-probs for a micro-batch; recomputed once if the reference changed since generation."""
        version = inputs.get("rpg_ref_version")
        if "ref_per_token_logps" in inputs and version is not None and int(version) == self._rpg_ref_version:
            return inputs["ref_per_token_logps"]
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        kwargs = {k: inputs[k] for k in _compat.MULTIMODAL_KEYS if k in inputs}
        batch_size = input_ids.size(0)
        with torch.no_grad(), _compat.disable_gradient_checkpointing(self.model,
                                                                      self.args.gradient_checkpointing_kwargs):
            if self.ref_model is not None:
                ref, _, _ = self._get_per_token_logps_and_entropies(
                    self.ref_model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs)
            else:
                unwrapped = self.accelerator.unwrap_model(self.model)
                adapter = "ref" if "ref" in unwrapped.peft_config else None
                with _compat.use_adapter(unwrapped, adapter_name=adapter):
                    ref, _, _ = self._get_per_token_logps_and_entropies(
                        self.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs)
        # cache in the (possibly buffered) batch, so a reused batch recomputes at most once per reference update
        inputs["ref_per_token_logps"] = ref
        inputs["rpg_ref_version"] = torch.tensor(self._rpg_ref_version)
        return ref

    # ------------------------------------------------------------------------------------------------------------
    # Generation: tag batches with the reference version they were scored against
    # ------------------------------------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs):
        # Override: dynamic sampling (DAPO) when training with it; and remember which reference scored the batch, so
        # a reference update mid-reuse is noticed.
        if self.args.dynamic_sampling and self.model.training:
            output = self._rpg_dynamic_sampling(inputs)
        else:
            output = super()._generate_and_score_completions(inputs)
        if self.beta != 0.0:
            output["rpg_ref_version"] = torch.tensor(self._rpg_ref_version)
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # Override: keep the rewards of the last round (gathered over all processes) for the dynamic-sampling filter.
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rpg_last_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _rpg_dynamic_sampling(self, inputs):
        """One training batch with dynamic sampling: generate and score rounds of prompts, drop the groups whose
        rewards do not vary, until `generation_batch_size / num_generations` groups are kept (or
        `dynamic_sampling_max_rounds` rounds are spent); then give each process `len(inputs)` rows of them.

        Every decision is taken from rewards gathered over all processes, so all processes run the same rounds and
        the same collectives. See `trl_rpg.dynamic_sampling`.
        """
        from accelerate.utils import gather_object

        from . import dynamic_sampling as ds

        args, acc = self.args, self.accelerator
        G, B, W, rank = self.num_generations, len(inputs), acc.num_processes, acc.process_index
        target = B * W // G
        state = self.state.stateful_callbacks.get(ds.STATE_KEY) or {}
        cursor = int(state.get("prompts_drawn", 0))
        exhausted_total = int(state.get("exhausted_batches", 0))
        stream = self._rpg_prompt_stream(B)
        buffer = ds.RoundBuffer(target, G, B, W, rank, fill=args.dynamic_sampling_on_exhausted == "train")

        batch = inputs
        for round_index in range(args.dynamic_sampling_max_rounds):
            if round_index > 0:
                batch, cursor = stream.draw(cursor)
            self._rpg_last_rewards_per_func = None
            output = super()._generate_and_score_completions(batch)
            rewards = self._rpg_last_rewards_per_func
            if rewards is None or rewards.size(0) != B * W:
                raise RuntimeError("dynamic_sampling needs the gathered rewards of each round (from "
                                   "`_calculate_rewards`); a subclass or TRL change bypassed it.")
            informative, spread = ds.group_reward_signal(rewards, self.reward_weights, G,
                                                         self.multi_objective_aggregation)
            buffer.add_round(output, informative, spread)
            if buffer.full:
                break
        self._rpg_last_rewards_per_func = None

        exhausted = not buffer.full
        exhausted_total += int(exhausted)
        self.state.stateful_callbacks[ds.STATE_KEY] = {"prompts_drawn": cursor, "exhausted_batches": exhausted_total}
        metrics = self._metrics["train"]
        if exhausted and args.dynamic_sampling_on_exhausted == "raise":
            stats = ds.summary(buffer, [], exhausted)
            for key, value in stats.items():
                metrics[f"dynamic_sampling/{key}"].append(value)
            raise RuntimeError(
                f"Dynamic sampling: after {buffer.rounds_used} generation rounds (dynamic_sampling_max_rounds="
                f"{args.dynamic_sampling_max_rounds}) only {buffer.groups_informative} of the {target} groups a "
                f"training batch needs have non-zero reward variance ({buffer.groups_generated} groups generated, "
                f"{stats['frac_filtered']:.1%} filtered). Raise dynamic_sampling_max_rounds, check the reward "
                f"functions, or set dynamic_sampling_on_exhausted='train' to train on the groups kept.")

        def exchange(outgoing):
            return gather_object([outgoing])

        merged, selected, plan = buffer.assemble(self._tokenizer.pad_token_id, exchange, device=acc.device)
        loss_mask = merged["completion_mask"] if "tool_mask" not in merged else (
            merged["completion_mask"] * merged["tool_mask"])
        merged["num_items_in_batch"] = acc.gather(loss_mask.sum()).sum()

        stats = ds.summary(buffer, selected, exhausted)
        for key, value in stats.items():
            metrics[f"dynamic_sampling/{key}"].append(value)
        metrics["dynamic_sampling/exhausted_total"].append(float(exhausted_total))
        if exhausted:
            logger.warning(
                "Dynamic sampling: %d of %d groups kept after %d rounds (dynamic_sampling_max_rounds); training on "
                "them plus %d groups without reward variance.", buffer.groups_informative, target,
                buffer.rounds_used, int(stats["groups_trained_without_signal"]))
        self._rpg_dynamic_sampling_last = {**stats, "rows_received": len(plan.receive),
                                           "rows_sent": sum(len(v) for v in plan.send.values())}
        return merged

    def _rpg_prompt_stream(self, local_batch_size):
        """The extra-prompt stream of dynamic sampling (built once per training set and batch size)."""
        from datasets import Dataset

        from . import dynamic_sampling as ds

        key = (id(self.train_dataset), local_batch_size)
        cached = getattr(self, "_rpg_ds_stream", None)
        if cached is None or cached[0] != key:
            dataset = self.train_dataset
            if self.args.remove_unused_columns and isinstance(dataset, Dataset):
                dataset = self._remove_unused_columns(dataset, description="training")
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            stream = ds.PromptStream(dataset, seed, self.shuffle_dataset, self.num_generations, local_batch_size,
                                     self.accelerator.num_processes, self.accelerator.process_index)
            self._rpg_ds_stream = (key, stream)
        return self._rpg_ds_stream[1]

    # ------------------------------------------------------------------------------------------------------------
    # Loss
    # ------------------------------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        # Override: RPG's per-token loss replaces GRPO's clipped ratio + k3 penalty; aggregation is GRPO's.
        args = self.args
        mode = "train" if self.model.training else "eval"
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        mask = mask.float()

        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled, **{k: inputs.get(k) for k in _compat.MULTIMODAL_KEYS},
        )
        entropy_mask = None
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)

        advantages = inputs["advantages"]
        old = inputs.get("old_per_token_logps")
        # No stored sampler log-probs means the batch is on-policy (one optimizer step per generation): mu = pi_theta
        sampling_logps = per_token_logps.detach() if old is None else old
        ref_logps = self._rpg_reference_logps(inputs, logits_to_keep) if self.beta != 0.0 else None

        logps = per_token_logps
        if self.importance_sampling_level == "sequence":
            # GSPO-style: every token of a sequence shares the length-normalised sequence ratio
            diff = torch.nan_to_num(per_token_logps - sampling_logps, nan=0.0) * mask
            seq_log_w = diff.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
            logps = sampling_logps + seq_log_w

        per_token_loss, stats = rpg_per_token_loss(
            logps, sampling_logps, advantages, mask, ref_logps=ref_logps, divergence=args.rpg_divergence,
            estimator=args.rpg_estimator, beta=self.rpg_beta, epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high, dual_clip_c=args.rpg_dual_clip_c,
        )

        if self.off_policy_mask_threshold is not None:
            adv2d = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
            per_token_loss = per_token_loss * self.get_off_policy_mask(
                advantages=adv2d, per_token_logps=per_token_logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", sampling_logps), mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )
        if entropy_mask is not None:
            per_token_loss = per_token_loss * entropy_mask
        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]

        loss = self.aggregate_loss(per_token_loss, mask, inputs, mode)

        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        if self.entropy_coef != 0.0:
            effective = mask if entropy_mask is None else mask * entropy_mask
            entropy = (entropies * effective).sum() / effective.sum().clamp(min=1.0)
            loss = loss - self.entropy_coef * entropy / accumulation
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        self._log_rpg_stats(stats, entropies, mask, mode)
        return loss

    def aggregate_loss(self, per_token_loss, mask, inputs, mode):
        """Aggregate the per-token loss as `loss_type` says (TRL 1.16's normalisations, unchanged)."""
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        masked = per_token_loss * mask
        if self.loss_type == "grpo":
            return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
        if self.loss_type == "bnpo":
            return masked.sum() / mask.sum().clamp(min=1.0) / accumulation
        if self.loss_type == "dr_grpo":
            return masked.sum() / (per_token_loss.size(0) * self.max_completion_length) / accumulation
        # "dapo": `num_items_in_batch` spans the generation batch on all ranks; rescale to one accumulation window
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return masked.sum() / normalizer

    def _log_rpg_stats(self, stats, entropies, mask, mode):
        n = stats["valid_tokens"]
        keys = ("divergence", "w_mean", "clip_frac_high", "clip_frac_low", "clip_frac_dual")
        local = torch.stack([stats[k] * n for k in keys] + [n, stats["excluded_tokens"],
                                                            (entropies.detach() * mask).sum(), mask.sum()])
        total = self.accelerator.reduce(local.to(torch.float32), reduction="sum")
        tokens = total[len(keys)].clamp(min=1.0)
        metrics = self._metrics[mode]
        for i, key in enumerate(keys):
            metrics[f"rpg/{key}"].append((total[i] / tokens).item())
        metrics["rpg/w_max"].append(self.accelerator.gather(stats["w_max"].reshape(1).float()).max().item())
        metrics["rpg/excluded_tokens"].append(total[len(keys) + 1].item())
        metrics["rpg/reference_updates"].append(float(self._rpg_ref_updates))
        metrics["entropy"].append((total[-2] / total[-1].clamp(min=1.0)).item())
        if self.rpg_beta > 0:
            metrics["kl"].append((total[0] / tokens).item())

        if mode == "train" and self.args.rpg_reference == "adaptive":
            self._rpg_kl_window += torch.stack([total[0].double(), total[len(keys)].double()]).cpu()
            if self.accelerator.sync_gradients:  # last micro-batch of the optimizer step
                step_kl = (self._rpg_kl_window[0] / self._rpg_kl_window[1].clamp(min=1.0)).item()
                decay = self.args.rpg_reference_kl_decay
                self._rpg_kl_ema = step_kl if self._rpg_kl_ema is None else decay * self._rpg_kl_ema + (
                    1 - decay) * step_kl
                self._rpg_kl_window.zero_()
                metrics["rpg/divergence_ema"].append(self._rpg_kl_ema)

    # ------------------------------------------------------------------------------------------------------------
    # Checkpoints: reference snapshot, schedule state, buffered generation batch; complete-or-invisible
    # ------------------------------------------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        # Override: add RPG state, then a completion marker; rotation only after the marker, so a crash mid-save
        # never leaves a half-written checkpoint that `resume_from_checkpoint=True` would pick.
        run_dir = self._get_output_dir(trial=trial)
        output_dir = os.path.join(run_dir, f"{_compat.PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        limit = self.args.save_total_limit
        self.args.save_total_limit = None
        try:
            if self.args.should_save and os.path.exists(os.path.join(output_dir, CHECKPOINT_MARKER)):
                os.remove(os.path.join(output_dir, CHECKPOINT_MARKER))
            super()._save_checkpoint(model, trial)
            self._rpg_save_state(output_dir)
            self.accelerator.wait_for_everyone()
            if self.args.should_save:
                with open(os.path.join(output_dir, CHECKPOINT_MARKER), "w") as f:
                    json.dump({"global_step": self.state.global_step,
                               "world_size": self.accelerator.num_processes}, f)
        finally:
            self.args.save_total_limit = limit
        if self.args.should_save and limit is not None:
            _compat.rotate_checkpoints(output_dir=run_dir, save_total_limit=limit,
                                       best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=False)

    def _rpg_save_state(self, output_dir):
        os.makedirs(output_dir, exist_ok=True)
        rank = self.accelerator.process_index
        buffer = self._buffered_inputs if self.args.rpg_save_generation_buffer else None
        torch.save({"step": self._step, "buffer": _to_device(buffer, "cpu")},
                   os.path.join(output_dir, BUFFER_FILE.format(rank=rank)))
        if self.args.rpg_reference in ("periodic", "adaptive"):
            tensors = _gather_to_cpu(self._rpg_reference_parameters(), keep=self.args.should_save)
            if self.args.should_save:
                torch.save(tensors, os.path.join(output_dir, REFERENCE_FILE))
        if self.args.should_save:
            with open(os.path.join(output_dir, STATE_FILE), "w") as f:
                json.dump({"reference_version": self._rpg_ref_version, "reference_updates": self._rpg_ref_updates,
                           "kl_ema": self._rpg_kl_ema, "skipped_steps": self._rpg_skipped_steps,
                           "rpg_reference": self.args.rpg_reference}, f)

    def _load_optimizer_and_scheduler(self, checkpoint):
        # Override: restore RPG state together with the optimizer (called once on resume, on every rank).
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        state_path = os.path.join(checkpoint, STATE_FILE)
        if os.path.exists(state_path):
            with open(state_path) as f:
                state = json.load(f)
            self._rpg_ref_version = state["reference_version"]
            self._rpg_ref_updates = state["reference_updates"]
            self._rpg_kl_ema = state["kl_ema"]
            self._rpg_skipped_steps = state.get("skipped_steps", 0)
        ref_path = os.path.join(checkpoint, REFERENCE_FILE)
        if self.args.rpg_reference in ("periodic", "adaptive") and os.path.exists(ref_path):
            _scatter_from_cpu(self._rpg_reference_parameters(), torch.load(ref_path, weights_only=True))
        buffer_path = os.path.join(checkpoint, BUFFER_FILE.format(rank=self.accelerator.process_index))
        if os.path.exists(buffer_path):
            saved = torch.load(buffer_path, weights_only=False, map_location="cpu")
            self._step = saved["step"]
            if saved["buffer"] is not None:
                self._buffered_inputs = _to_device(saved["buffer"], self.accelerator.device)

    def train(self, resume_from_checkpoint=None, trial=None, **kwargs):
        # Override: resume only from checkpoints whose RPG marker shows they were written completely.
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No complete RPG checkpoint found in output_dir={self.args.output_dir!r} "
                                 f"(a complete one holds {CHECKPOINT_MARKER}).")
        elif isinstance(resume_from_checkpoint, str) and not os.path.exists(
                os.path.join(resume_from_checkpoint, CHECKPOINT_MARKER)):
            raise ValueError(f"resume_from_checkpoint={resume_from_checkpoint!r} is not a complete RPG checkpoint "
                             f"(no {CHECKPOINT_MARKER}); it was probably interrupted while being written.")
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)

    # ------------------------------------------------------------------------------------------------------------
    # Model card
    # ------------------------------------------------------------------------------------------------------------

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        # Override: TRL's card (citing the RPG paper via `_paper`), plus the RPG settings used.
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, "README.md")
        if not os.path.exists(path):
            return
        a = self.args
        section = textwrap.dedent(f"""
            ## RPG settings

            Trained with RPG ([arXiv:2505.17508](https://huggingface.co/papers/2505.17508)) via `trl_rpg.RPGTrainer`:

            | setting | value |
            |---|---|
            | divergence | `{a.rpg_divergence}` |
            | estimator | `{a.rpg_estimator}` |
            | reference policy | `{a.rpg_reference}` |
            | beta | `{self.rpg_beta}` |
            | clip (eps_low, eps_high, c) | `({a.epsilon}, {a.epsilon_high}, {a.rpg_dual_clip_c})` |
            | aggregation (`loss_type`) | `{a.loss_type}` |
            """)
        with open(path, "a") as f:
            f.write(section)


# ----------------------------------------------------------------------------------------------------------------
# Callbacks and helpers
# ----------------------------------------------------------------------------------------------------------------


class _ReferenceScheduleCallback(TrainerCallback):
    """Applies the "periodic" / "adaptive" reference schedule after each optimizer step."""

    def __init__(self, trainer: RPGTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        if args.rpg_reference == "periodic":
            due = state.global_step % args.rpg_reference_update_steps == 0
        else:
            due = trainer._rpg_kl_ema is not None and trainer._rpg_kl_ema > args.rpg_reference_kl_target
        if due:
            trainer.update_reference()
        return control


class _NonFiniteGradientGuard(TrainerCallback):
    """Skips an optimizer step whose gradients hold NaN/inf (without DeepSpeed, which owns its gradients)."""

    def __init__(self, trainer: RPGTrainer):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        trainer = self.trainer
        if trainer.is_deepspeed_enabled:
            return control
        params = [p for p in trainer.model.parameters() if p.grad is not None]
        if not params:
            return control
        # one fused pass: a gradient holds NaN/inf exactly when its norm does
        finite = torch.isfinite(torch.stack(torch._foreach_norm([p.grad for p in params]))).all().float()
        finite = trainer.accelerator.reduce(finite.reshape(1), reduction="sum").item()
        if finite < trainer.accelerator.num_processes:
            for p in params:
                p.grad = None  # torch optimizers skip parameters without a gradient: the step is a no-op
            trainer._rpg_skipped_steps += 1
            trainer._metrics["train"]["rpg/skipped_steps"].append(float(trainer._rpg_skipped_steps))
            logger.warning("RPGTrainer: non-finite gradient at step %d; optimizer step skipped (%d so far).",
                           state.global_step + 1, trainer._rpg_skipped_steps)
        return control


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest `checkpoint-N` folder under `output_dir` holding RPG's completion marker."""
    if not os.path.isdir(output_dir):
        return None
    prefix = _compat.PREFIX_CHECKPOINT_DIR + "-"
    steps = []
    for name in os.listdir(output_dir):
        path = os.path.join(output_dir, name)
        if name.startswith(prefix) and name[len(prefix):].isdigit() and os.path.exists(
                os.path.join(path, CHECKPOINT_MARKER)):
            steps.append((int(name[len(prefix):]), path))
    return max(steps)[1] if steps else None


def _to_device(obj, device):
    if obj is None:
        return None
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(v, device) for v in obj)
    return obj


def _is_zero3_param(p) -> bool:
    return hasattr(p, "ds_id")


#: Elements gathered at once when ZeRO-3 parameters are copied, saved or restored: the transient full-size memory
#: of a reference update or a checkpoint is bounded by this, not by the size of the model.
ZERO3_GATHER_NUMEL = 50_000_000


def _full_numel(p) -> int:
    return p.ds_numel if _is_zero3_param(p) else p.numel()


def _groups(items, numel):
    """Consecutive groups of `items` holding at most ZERO3_GATHER_NUMEL elements (at least one item each)."""
    group, size = [], 0
    for item in items:
        n = numel(item)
        if group and size + n > ZERO3_GATHER_NUMEL:
            yield group
            group, size = [], 0
        group.append(item)
        size += n
    if group:
        yield group


def _copy_parameters(source, target) -> None:
    """target <- source, parameter by parameter. ZeRO-3: gathered a bounded group at a time (a collective call),
    copied on rank 0 and re-partitioned from it."""
    pairs = list(zip(source, target, strict=True))
    if not any(_is_zero3_param(p) for pair in pairs for p in pair):
        with torch.no_grad():
            for s, t in pairs:
                t.data.copy_(s.data)
        return
    import deepspeed

    rank0 = deepspeed.comm.get_rank() == 0
    for group in _groups(pairs, lambda pair: _full_numel(pair[0]) + _full_numel(pair[1])):
        with deepspeed.zero.GatheredParameters([p for pair in group for p in pair], modifier_rank=0), \
                torch.no_grad():
            for s, t in group:
                if rank0 or not _is_zero3_param(t):
                    t.data.copy_(s.data)


def _gather_to_cpu(params: list[nn.Parameter], keep: bool = True) -> list[torch.Tensor] | None:
    """Full CPU copies of `params`, or None where `keep` is False. ZeRO-3 parameters are gathered a bounded group at
    a time, on every rank (a collective call); only ranks that keep the result copy it to the CPU."""
    if not any(_is_zero3_param(p) for p in params):
        return [p.data.detach().cpu().clone() for p in params] if keep else None
    import deepspeed

    tensors = []
    for group in _groups(params, _full_numel):
        with deepspeed.zero.GatheredParameters(group):
            if keep:
                tensors.extend(p.data.detach().cpu().clone() for p in group)
    return tensors if keep else None


def _scatter_from_cpu(params: list[nn.Parameter], tensors: list[torch.Tensor]) -> None:
    if len(params) != len(tensors):
        raise ValueError(f"Reference snapshot has {len(tensors)} tensors but the reference has {len(params)} "
                         "parameters; was the checkpoint written with a different model or PEFT config?")
    if not any(_is_zero3_param(p) for p in params):
        with torch.no_grad():
            for p, t in zip(params, tensors):
                p.data.copy_(t.to(p.device, p.dtype))
        return
    import deepspeed

    rank0 = deepspeed.comm.get_rank() == 0
    for group in _groups(list(zip(params, tensors)), lambda pair: _full_numel(pair[0])):
        with deepspeed.zero.GatheredParameters([p for p, _ in group], modifier_rank=0), torch.no_grad():
            for p, t in group:
                if rank0 or not _is_zero3_param(p):
                    p.data.copy_(t.to(p.device, p.dtype))


__all__ = ["RPGTrainer", "last_complete_checkpoint"]
