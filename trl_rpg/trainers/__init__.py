"""The TRL trainers: `RPGTrainer` / `RPGConfig` (subclasses of TRL's `GRPOTrainer` / `GRPOConfig`) and
`AsyncRPGTrainer` / `AsyncRPGConfig` (of `trl.experimental.async_grpo`), and what only they need: the reference
policy, the sampler's log-probs, the start-up description, the model card, the construction checks
(`validation.construction_checks` lists them in order) and the asynchronous trainer's config, sampler and sample
checks.

May import: `trl_rpg.objectives`, `trl_rpg.run`, `trl_rpg.upgrade`, `trl_rpg.dynamic_sampling`, `trl_rpg.rewards`,
`trl_rpg._compat`, TRL and the Hugging Face stack; never `cli`, `toy`, `smollm2` or `evaluation`. The asynchronous
modules import `trl.experimental` and are loaded only when asked for (`trl_rpg.AsyncRPGTrainer`).
"""
