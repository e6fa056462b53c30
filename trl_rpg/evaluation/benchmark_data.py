"""The bundled benchmarks (AIME 2024, AIME 2025, AMC 2023) as data sets: where their parquet files are
(``trl_rpg/data``), each row's problem (:func:`problem_text`), and :func:`load_benchmark`, which adds each row's
reference answer, problem id and sample index. The evaluation (:mod:`trl_rpg.evaluation.evaluate`) reads them.

``datasets`` and ``pyarrow`` are imported only by :func:`load_benchmark`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..rewards import completion_to_text, reference_answer

if TYPE_CHECKING:  # pragma: no cover
    import datasets


__all__ = ["BENCHMARKS", "load_benchmark", "problem_text"]

logger = logging.getLogger(__name__)

#: Benchmark name -> bundled parquet file (in ``trl_rpg/data``).
BENCHMARKS: dict[str, str] = {
    "aime24": "aime-2024.parquet",
    "aime25": "aime25.parquet",
    "amc23": "amc-23.parquet",
}



def _data_file(filename: str, data_dir: str | Path | None) -> Path:
    if data_dir is not None:
        return Path(data_dir) / filename
    try:
        from importlib.resources import files

        resource = files(__package__ or "trl_rpg").joinpath("data", filename)
        path = Path(str(resource))
        if path.is_file():
            return path
    except Exception:  # (namespace-package quirks, zip imports...: use the module directory)
        logger.debug("importlib.resources lookup failed for %s", filename, exc_info=True)
    return Path(__file__).resolve().parents[1] / "data" / filename  # trl_rpg/data


def problem_text(row: Mapping[str, Any]) -> str:
    """The problem of a data set row, which identifies it: ``extra_info.raw_problem`` if present, else the prompt
    (a string, or the contents of its chat messages), else a ``problem`` / ``question`` column."""
    extra = row.get("extra_info")
    if isinstance(extra, Mapping) and extra.get("raw_problem"):
        return str(extra["raw_problem"])
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if prompt:
        return "\n".join(completion_to_text([m]) for m in prompt)
    return str(row.get("problem", row.get("question", "")))


def load_benchmark(name: str, data_dir: str | Path | None = None) -> datasets.Dataset:
    """Load a bundled benchmark as an in-memory ``datasets.Dataset``.

    Args:
        name: one of ``BENCHMARKS`` (``"aime24"``, ``"aime25"``, ``"amc23"``); the parquet file stem (e.g.
            ``"aime-2024"``) is accepted too.
        data_dir: directory holding the parquet file; defaults to the package's ``trl_rpg/data``.

    Returns:
        The parquet's rows and columns (``prompt``, ``reward_model``, ``extra_info``, ``data_source``, ``ability``),
        plus

        * ``ground_truth`` (str): ``reward_model["ground_truth"]``;
        * ``problem_id`` (int): 0-based id of the problem, numbered in order of first appearance of
          ``extra_info["raw_problem"]``.  (``extra_info["index"]`` is *not* a problem id in every file: in AIME 2025
          and AMC 2023 it numbers the 32 copies of each problem.)
        * ``sample_index`` (int): 0-based index of the row among the copies of its problem (in file order).
    """
    import datasets  # lazy: keep `import trl_rpg.evaluation.evaluate` light
    import pyarrow.parquet as pq

    key = str(name).strip().lower()
    stems = {Path(f).stem.lower(): n for n, f in BENCHMARKS.items()}
    key = stems.get(key, key)
    if key not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {name!r}; allowed names: {sorted(BENCHMARKS)}.")
    path = _data_file(BENCHMARKS[key], data_dir)
    if not path.is_file():
        raise FileNotFoundError(f"Benchmark file for {key!r} not found: {path}")
    dataset = datasets.Dataset(pq.read_table(path))

    ground_truths: list[str] = []
    problem_ids: list[int] = []
    sample_indices: list[int] = []
    ids: dict[str, int] = {}
    counts: dict[int, int] = {}
    for row in dataset.select_columns(["prompt", "reward_model", "extra_info"]):
        gold = reference_answer(row)
        if gold is None:
            raise ValueError(f"{path.name}: a row has no reward_model.ground_truth")
        ground_truths.append(gold)
        pid = ids.setdefault(problem_text(row), len(ids))
        problem_ids.append(pid)
        sample_indices.append(counts.get(pid, 0))
        counts[pid] = counts.get(pid, 0) + 1
    dataset = dataset.add_column("ground_truth", ground_truths)
    dataset = dataset.add_column("problem_id", problem_ids)
    dataset = dataset.add_column("sample_index", sample_indices)
    return dataset

