"""Reproducible benchmarks: RPG against GRPO and DAPO.

* ``python -m benchmarks.learning [--quick]`` -- held-out accuracy on the toy arithmetic task (``trl_rpg.toy.task``).
* ``python -m benchmarks.offpolicy [--quick]`` -- the same, as each generation batch is reused for 1, 4 and 16
  optimizer steps (the paper's off-policy regime), with the drift from the sampler measured for every method.
* ``python -m benchmarks.cost [--quick] [--device cpu|cuda]`` -- step time and peak memory, interleaved runs.
* ``python -m benchmarks.bandit_optimum [--quick]`` -- the policy each trainer's KL term converges to on a contextual
  bandit, against the analytic optimum of each divergence.

Results (JSON + PNG) go to ``benchmarks/results/``; ``docs/benchmarks.md`` holds the latest tables.
"""
