"""Reproducible benchmarks: RPG against GRPO and DAPO.

* ``python -m benchmarks.learning [--quick]`` -- held-out accuracy on the toy arithmetic task (``trl_rpg.toy``).
* ``python -m benchmarks.cost [--quick] [--device cpu|cuda]`` -- step time and peak memory, interleaved runs.

Results (JSON + PNG) go to ``benchmarks/results/``; ``docs/benchmarks.md`` holds the latest tables.
"""
