"""Measuring a model and a run: the AIME / AMC benchmarks (mean@k; `evaluate`, `benchmark_data`,
`benchmark_scores`, `generation` with transformers or vLLM) and the plots of a run's logs (`plots`,
`plot_callback`).

May import: `trl_rpg.rewards`, torch, transformers, optionally vLLM and matplotlib; never a trainer.
"""

from .evaluate import (
    BACKENDS,
    BENCHMARKS,
    Generations,
    evaluate_benchmarks,
    evaluate_model,
    generate_completions,
    generate_with_vllm,
    load_benchmark,
)

__all__ = ["BACKENDS", "BENCHMARKS", "Generations", "evaluate_benchmarks", "evaluate_model", "generate_completions",
           "generate_with_vllm", "load_benchmark"]
