"""Dynamic sampling (DAPO's group filter) for `RPGTrainer`: generation rounds until a batch of groups with a learning
signal is full (`sampling`), the rows carried between rounds (`round_buffer`) and the prompt stream they draw from
(`prompt_stream`).

May import: `trl_rpg.run` (the batch layout, the group statistics), torch.
"""
