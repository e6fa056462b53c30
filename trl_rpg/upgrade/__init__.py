"""The TRL-upgrade check, below the trainers: the reviewed surface of TRL that the trainers rely on (`guard`:
method digests and the GRPO field table `grpo_fields`; `async_guard` for `trl.experimental.async_grpo`), the
behavioural self-check run when that surface changed (`self_check`, `async_self_check`), and its cached verdict
(`verdict`). The trainer under review hands its own class in (`guard.check`); nothing here imports a trainer.

May import: `trl_rpg.run` (the batch layout), `trl_rpg.toy` (the self-check's tiny model), `trl_rpg._compat`, TRL.
"""
