"""A checkpoint that cannot be written or read says why, naming the file (issue 35 section 3, issue 33 section 1).

- a full disk or an exceeded quota is explained whichever of a checkpoint's files was being written, in whatever
  words its writer (Python, torch, safetensors, tokenizers) said it;
- a crash between the manifest and the removal of the writing marker leaves a checkpoint that resumes, the window
  named; the folder is fsynced between the two;
- a damaged file (JSON nested too deep, `trainer_state.json` or `rpg_state.json` of the wrong types, an fp16
  scaler's state for a run without a scaler) is a `CheckpointError` naming it, so `resume_from_checkpoint=True`
  passes over it; a folder such as `checkpoint-²` is not a checkpoint;
- a folder that cannot be emptied before a save stops the save; an adaptive checkpoint needs its reference snapshot;
  settings compare as the manifest stores them.

Checkpoints are built by hand with the package's own writers (`write_manifest` hashes what is there): nothing is
trained. tests/test_checkpoints.py verifies real checkpoints.
"""

import errno
import json
import logging
import os
from types import SimpleNamespace

import pytest
import torch

from trl_rpg.run import checkpoint as ckpt
from trl_rpg.run.checkpoint import CheckpointError, files

STATE = {"reference_version": 0, "reference_updates": 0, "kl_ema": None, "skipped_steps": 0}


def _run(reference="initial", grad_scaler=None, **fields):
    """A run identity (`run_identity`) for a tiny model: a batch layout, every other identity field None unless
    given."""
    args = SimpleNamespace(rpg_reference=reference,
                           **{name: None for group in ckpt.IDENTITY_FIELDS.values() for name in group})
    batch = dict(per_device_train_batch_size=8, gradient_accumulation_steps=1, num_generations=4,
                 steps_per_generation=4, num_iterations=1)
    for name, value in {**batch, **fields}.items():
        setattr(args, name, value)
    return ckpt.run_identity(args, torch.nn.Linear(2, 2), grad_scaler=grad_scaler)


def _checkpoint(folder, step=2, run=None, run_id="run-a", trainer_state=None, state=None, extra=None):
    """A complete checkpoint written as `RPGTrainer` writes one (its files, then `write_manifest`)."""
    folder.mkdir(parents=True)
    trainer_state = {"global_step": step, "log_history": [], "stateful_callbacks": {}} if trainer_state is None \
        else trainer_state
    (folder / ckpt.TRAINER_STATE_FILE).write_text(trainer_state if isinstance(trainer_state, str)
                                                  else json.dumps(trainer_state))
    (folder / ckpt.STATE_FILE).write_text(state if isinstance(state, str) else json.dumps(state or STATE))
    for name, content in (extra or {}).items():
        (folder / name).write_bytes(content)
    own = ckpt.save_generation_buffer(str(folder), 0, step, None)
    ckpt.write_manifest(str(folder), step, 1, run or _run(), [own], save_only_model=False, run_id=run_id)
    return str(folder)


def _resume_true(output_dir, run):
    """`resume_from_checkpoint=True` on one process (what `RPGTrainer.train` calls)."""
    return ckpt.choose(True, str(output_dir), lambda p: ckpt.verify_for_process(p, run, 1, 0, True),
                       lambda failure: [failure])[0]


def _nested(depth=100_000) -> str:
    return "[" * depth + "]" * depth


# ----------------------------------------------------------------------------------------------------------------
# A full disk or quota, whoever writes the file
# ----------------------------------------------------------------------------------------------------------------


def _writer_errors(tmp_path):
    """The error each writer of a checkpoint's files raises when the disk refuses a write, raised for real where the
    writer writes in place (/dev/full); safetensors writes a temporary file and renames it, so its error is built
    with the text it carries."""
    from safetensors import SafetensorError
    from tokenizers import Tokenizer, models

    full = tmp_path / "full"
    full.mkdir()

    def raised(write, name):
        (full / name).symlink_to("/dev/full")
        try:
            write(str(full / name))
        except Exception as error:
            return error
        raise AssertionError(f"writing {name} to /dev/full did not fail")

    tokenizer = Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    return {
        "torch.save, a large file": raised(lambda p: torch.save({"exp_avg": torch.ones(100_000)}, p), "optimizer.pt"),
        "torch.save, a small file": raised(lambda p: torch.save({"step": 1}, p), "scheduler.pt"),
        "tokenizers": raised(tokenizer.save, "tokenizer.json"),
        "safetensors": SafetensorError("Error while serializing: I/O error: Disk quota exceeded (os error 122)"),
        "Python": OSError(errno.EDQUOT, "Disk quota exceeded"),
    }


#: Each file of a checkpoint (full fine-tuning, a moving reference) and the writer that writes it.
FILE_WRITERS = {
    "model.safetensors": "safetensors", "rpg_reference.safetensors": "safetensors",
    "rpg_generation_buffer_rank0.safetensors": "safetensors", "optimizer.pt": "torch.save, a large file",
    "scheduler.pt": "torch.save, a small file", "rng_state.pth": "torch.save, a small file",
    "training_args.bin": "torch.save, a small file", "tokenizer.json": "tokenizers", "config.json": "Python",
    "generation_config.json": "Python", "tokenizer_config.json": "Python", "chat_template.jinja": "Python",
    "trainer_state.json": "Python", "rpg_state.json": "Python", "rpg_generation_buffer_rank0.json": "Python",
    "rpg_checkpoint_complete.json": "Python", "rpg_checkpoint_writing.json": "Python",
}


def test_a_full_quota_is_explained_whichever_file_was_being_written(tmp_path, monkeypatch):
    """With space left on the disk (a quota): the errors that carry their cause (Python's errno, Rust's
    `(os error 122)`) say it; torch's carry none (`unexpected pos 576 vs 534`, `basic_ios::clear`), and a write
    that fails again in the folder decides."""
    errors = _writer_errors(tmp_path)
    monkeypatch.setattr(files, "_free_bytes", lambda path: 1 << 40)
    monkeypatch.setattr(files, "_disk_refuses_writes", lambda directory: errno.EDQUOT)
    directory = tmp_path / "run" / "checkpoint-6"
    quota, full = (f"Your disk quota is exceeded on the disk holding {directory}",
                   f"The disk holding {directory} is full")
    said = {"tokenizers": full,  # /dev/full's own ENOSPC, in its text: `(os error 28)`
            "safetensors": quota, "Python": quota,  # EDQUOT, in the text or the errno
            "torch.save, a large file": quota, "torch.save, a small file": quota}  # no cause: the probe's
    for name, writer in FILE_WRITERS.items():
        with pytest.raises(ckpt.CheckpointDiskFull) as raised:
            with ckpt.explain_disk_full(str(directory)):
                raise errors[writer]
        message = str(raised.value)
        assert said[writer] in message, (name, message)
        assert type(errors[writer]).__name__ in message and "left incomplete" in message, name
    # where the disk takes writes, torch's errno-less error is not taken for a full disk
    monkeypatch.setattr(files, "_disk_refuses_writes", lambda directory: None)
    with pytest.raises(RuntimeError, match="basic_ios::clear"):
        with ckpt.explain_disk_full(str(directory)):
            raise errors["torch.save, a small file"]


def test_a_write_that_fails_again_is_what_the_probe_reports(tmp_path, monkeypatch):
    """The probe writes (and fsyncs) in the checkpoint's folder, or the nearest one that exists."""
    assert files._disk_refuses_writes(str(tmp_path / "not-yet" / "checkpoint-1")) is None
    real_fsync = os.fsync

    def quota(fd):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(os, "fsync", quota)
    try:
        assert files._disk_refuses_writes(str(tmp_path)) == errno.EDQUOT
    finally:
        monkeypatch.setattr(os, "fsync", real_fsync)
    assert os.listdir(tmp_path) == []  # nothing left behind


# ----------------------------------------------------------------------------------------------------------------
# A crash between the manifest and the marker's removal
# ----------------------------------------------------------------------------------------------------------------


def test_a_crash_after_the_manifest_leaves_a_checkpoint_that_resumes_naming_the_window(tmp_path, caplog):
    run = _run()
    folder = _checkpoint(tmp_path / "run" / "checkpoint-2", run=run)
    ckpt.write_json_atomic(os.path.join(folder, ckpt.WRITING_FILE), {"step": 2, "run_id": "run-a", "started_at": 1.0})
    with caplog.at_level(logging.WARNING, logger="trl_rpg.run.checkpoint"):
        assert _resume_true(tmp_path / "run", run) == folder
    assert "still holds its writing marker" in caplog.text and "after writing the manifest and before" in caplog.text
    # a marker of another save is not that crash: refused, named
    ckpt.write_json_atomic(os.path.join(folder, ckpt.WRITING_FILE), {"step": 5, "run_id": "run-b", "started_at": 1.0})
    with pytest.raises(CheckpointError, match=f"{ckpt.WRITING_FILE} is not this checkpoint's writing marker"):
        ckpt.verify_checkpoint(folder, run)


def test_the_folder_is_fsynced_between_the_manifest_and_the_markers_removal(tmp_path, monkeypatch):
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    (folder / ckpt.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": 2}))
    ckpt.write_json_atomic(str(folder / ckpt.WRITING_FILE), {"step": 2, "run_id": "run-a", "started_at": 1.0})
    own = ckpt.save_generation_buffer(str(folder), 0, 2, None)
    events = []
    real_fsync, real_replace, real_remove = os.fsync, os.replace, os.remove
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(b))), real_replace(a, b)))
    monkeypatch.setattr(os, "remove", lambda p: (events.append(("remove", str(p))), real_remove(p)))
    ckpt.write_manifest(str(folder), 2, 1, _run(), [own], save_only_model=False, run_id="run-a")
    manifest = events.index(("replace", str(folder / ckpt.MANIFEST_FILE)))
    removed = events.index(("remove", str(folder / ckpt.WRITING_FILE)))
    assert ("fsync", str(folder)) in events[manifest + 1:removed]
    assert ("fsync", str(folder)) in events[removed + 1:]


# ----------------------------------------------------------------------------------------------------------------
# Damaged files: a CheckpointError naming the file, passed over by resume_from_checkpoint=True
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("damage", "said"), [
    ({"trainer_state": {"global_step": 4, "log_history": {"loss": 1.0}, "stateful_callbacks": {}}},
     "trainer_state.json is damaged: 'log_history'"),
    ({"trainer_state": {"global_step": "4", "log_history": []}}, "trainer_state.json is damaged: 'global_step'"),
    ({"trainer_state": {"global_step": 4, "log_history": [], "stateful_callbacks": [1]}},
     "trainer_state.json is damaged: 'stateful_callbacks'"),
    ({"trainer_state": {"global_step": 4, "log_history": [], "globl_step": 4}},
     "'globl_step' (4) is no field of transformers' TrainerState"),
    ({"trainer_state": _nested()}, "trainer_state.json (its JSON is nested too deep"),
    ({"trainer_state": [4]}, "trainer_state.json is damaged: it holds a list"),
    ({"state": _nested()}, "rpg_state.json (its JSON is nested too deep"),
    ({"state": {**STATE, "reference_updates": "two"}}, "rpg_state.json is damaged: 'reference_updates' is 'two'"),
    ({"extra": {"config.json": _nested().encode()}}, "config.json (its JSON is nested too deep"),
    ({"extra": {ckpt.SCALER_FILE: b"an fp16 run's scaler"}},
     "scaler.pt holds the gradient scaler of a run trained in fp16"),
], ids=["log_history", "global_step", "stateful_callbacks", "unknown_field", "nested_trainer_state", "a_list",
        "nested_rpg_state", "rpg_state_value", "nested_config", "scaler_without_scaler"])
def test_a_damaged_file_is_named_and_passed_over_by_resume_true(tmp_path, caplog, damage, said):
    run = _run(grad_scaler=False)
    out = tmp_path / "run"
    previous = _checkpoint(out / "checkpoint-2", run=run)
    damaged = _checkpoint(out / "checkpoint-4", step=4, run=run, **damage)
    with pytest.raises(CheckpointError) as error:
        ckpt.verify_checkpoint(damaged, run)
    assert said in str(error.value) and damaged in str(error.value), str(error.value)
    with caplog.at_level(logging.WARNING, logger="trl_rpg.run.checkpoint"):
        assert _resume_true(out, run) == previous
    assert f"Not resuming from {damaged}" in caplog.text


def test_a_scaler_state_resumes_where_the_run_has_a_scaler(tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-2", extra={ckpt.SCALER_FILE: b"scaler"})
    for grad_scaler in (True, None):  # fp16 on a GPU; a caller that does not say
        ckpt.verify_checkpoint(folder, _run(grad_scaler=grad_scaler))


def test_a_nested_manifest_is_passed_over_and_listing_the_folder_survives_it(tmp_path, caplog):
    out = tmp_path / "run"
    previous = _checkpoint(out / "checkpoint-2")
    os.makedirs(out / "checkpoint-4")
    (out / "checkpoint-4" / ckpt.MANIFEST_FILE).write_text(_nested())
    assert ckpt.run_of(str(out / "checkpoint-4")) == (None, 0.0)
    with caplog.at_level(logging.WARNING, logger="trl_rpg.run.checkpoint"):
        assert _resume_true(out, _run()) == previous
    assert "The completion marker is damaged" in caplog.text and "nested too deep" in caplog.text


def test_a_damaged_buffer_description_is_named(tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-2")
    meta = os.path.join(folder, "rpg_generation_buffer_rank0.json")
    ckpt.write_json_atomic(meta, {"format": ckpt.FORMAT_VERSION, "step": "two", "buffer": None, "rows": None})
    with pytest.raises(CheckpointError, match=f"does not match its description {meta}"):
        ckpt.load_generation_buffer(folder, 0)


def test_a_folder_named_checkpoint_and_a_superscript_is_not_a_checkpoint(tmp_path):
    """`str.isdigit` takes `²`, which `int` refuses: every fresh run into the folder stopped there."""
    out = tmp_path / "run"
    previous = _checkpoint(out / "checkpoint-2")
    for odd in ("checkpoint-²", "checkpoint-٣", "checkpoint-1.5", "checkpoint-"):
        (out / odd).mkdir()
    assert ckpt.checkpoint_folders(str(out)) == [previous]
    ckpt.warn_if_other_runs(str(out))
    assert _resume_true(out, _run()) == previous


# ----------------------------------------------------------------------------------------------------------------
# Issue 33 section 1: emptying a folder, the adaptive reference snapshot, settings as the manifest stores them
# ----------------------------------------------------------------------------------------------------------------


def test_a_folder_that_cannot_be_emptied_stops_the_save(tmp_path, monkeypatch):
    """A save empties its `checkpoint-N` folder first so that its manifest certifies only what it wrote: a file that
    cannot be removed (PermissionError) stops the save; a file already gone (another process emptying a shared
    folder) does not."""
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"an earlier run's weights")
    (folder / "optimizer.pt").write_bytes(b"an earlier run's optimizer")
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if os.fspath(path).endswith("model.safetensors"):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        if os.fspath(path).endswith("optimizer.pt"):
            real_unlink(path, *args, **kwargs)
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(PermissionError):
        ckpt.begin_checkpoint(str(folder), 3, "run-a")
    assert not (folder / ckpt.WRITING_FILE).exists()
    monkeypatch.setattr(os, "unlink", real_unlink)
    (folder / "model.safetensors").unlink()
    (folder / "optimizer.pt").write_bytes(b"gone by the time it is removed")
    monkeypatch.setattr(os, "unlink", unlink)
    ckpt.begin_checkpoint(str(folder), 3, "run-a")
    assert os.listdir(folder) == [ckpt.WRITING_FILE]


def test_an_adaptive_checkpoint_without_its_reference_snapshot_is_refused(tmp_path):
    """The adaptive reference moves like the periodic one: its snapshot is required (without it, resume would go on
    with the initial model as reference)."""
    for reference in ("periodic", "adaptive"):
        run = _run(reference)
        folder = _checkpoint(tmp_path / reference / "checkpoint-2", run=run)
        with pytest.raises(CheckpointError, match=f"{ckpt.REFERENCE_FILE} is not listed in the completion marker"):
            ckpt.verify_checkpoint(folder, run)
    ckpt.verify_checkpoint(_checkpoint(tmp_path / "initial" / "checkpoint-2"), _run())


def test_settings_given_as_tuples_compare_equal_to_the_manifests_lists(tmp_path):
    """JSON stores a tuple as a list: a run resumed with the very same `reward_weights=(1.0, 0.5)` is not told they
    changed."""
    run = _run(reward_weights=(1.0, 0.5))
    folder = _checkpoint(tmp_path / "checkpoint-2", run=run)
    saved = ckpt.read_manifest(folder)["run"]
    assert saved["objective"]["reward_weights"] == [1.0, 0.5]
    assert ckpt.compare_runs(folder, saved, _run(reward_weights=(1.0, 0.5))) == []
    assert ckpt.compare_runs(folder, saved, _run(reward_weights=(1.0, 2.0))) == [
        "reward_weights [1.0, 0.5] -> [1.0, 2.0] (the objective changes from this step on)"]
