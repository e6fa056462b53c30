"""The training data: the one loader of `trl-rpg train` and `examples/rpg_math.py` (a dataset mixture, a local file or
folder of them, or a Hub data set)."""

from __future__ import annotations

from pathlib import Path

#: File extensions of local data files and the `datasets` builder that reads them.
DATA_FILE_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".arrow": "arrow"}


def looks_like_data_file(name: str) -> bool:
    """Whether `name` names a local data file (it ends with one of `DATA_FILE_BUILDERS`' extensions)."""
    return Path(name).suffix.lower() in DATA_FILE_BUILDERS


def check_dataset_name(name: str | None) -> None:
    """Refuse at once a `--dataset_name` that names a local data file that does not exist (rather than asking the Hub
    for a data set called `nope.parquet`)."""
    if name and looks_like_data_file(name) and not Path(name).expanduser().exists():
        looked_for = Path(name).expanduser().absolute()
        raise FileNotFoundError(f"--dataset_name {name!r}: no such file (looked for {looked_for}"
                                "). Give the path of an existing .parquet/.json/.jsonl/.csv/.arrow file, a folder of "
                                "them, or a Hub data set id.")


def load_training_data(script_args, dataset_args=None):
    """The `DatasetDict` to train on: a dataset mixture (`--datasets`), a local file or folder, or a Hub data set.

    A local file becomes the `script_args.dataset_train_split` split. Used by `trl-rpg train` and by
    `examples/rpg_math.py` alike.
    """
    from datasets import DatasetDict, load_dataset

    if dataset_args is not None and dataset_args.datasets:
        from trl import get_dataset

        return get_dataset(dataset_args)
    name = script_args.dataset_name
    if not name:
        raise ValueError("No training data: pass --dataset_name (a Hub data set, a local .parquet/.json/.jsonl/.csv "
                         "file or a folder of them) or --datasets.")
    check_dataset_name(name)
    path = Path(name).expanduser()
    if path.is_file():
        builder = DATA_FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(f"--dataset_name={name!r}: unsupported file type {path.suffix!r}; use one of "
                             f"{sorted(DATA_FILE_BUILDERS)}.")
        dataset = load_dataset(builder, data_files={script_args.dataset_train_split: str(path)})
    else:
        dataset = load_dataset(name, name=script_args.dataset_config, streaming=script_args.dataset_streaming)
    if not isinstance(dataset, DatasetDict) and not hasattr(dataset, "keys"):
        dataset = DatasetDict({script_args.dataset_train_split: dataset})
    return dataset
