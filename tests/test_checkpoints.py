"""A checkpoint is resumed only if it is whole and the run's: the manifest lists every file with its SHA-256 and what
identifies the run, resume verifies it, and a damaged, incomplete, tampered, linked or mismatched checkpoint is
refused with an error naming the problem (or, with `resume_from_checkpoint=True`, skipped for the previous complete
one with a warning). Nothing is unpickled.

One run (periodic reference, checkpoints at steps 3 and 6, 4 optimizer steps per generation batch so both
checkpoints fall inside a reused batch) is trained once; each test damages a copy of its output directory.
"""

import errno
import hashlib
import json
import logging
import os
import shutil

import pytest
import torch
from _resume_script import make_trainer
from _tiny import save_tiny_model

from trl_rpg.run import checkpoint as ckpt
from trl_rpg.run.checkpoint import CheckpointError, ScheduleMismatch

BUFFER = "rpg_generation_buffer_rank0.safetensors"
BUFFER_META = "rpg_generation_buffer_rank0.json"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, model_path):
    """An uninterrupted periodic run: its output directory and final parameters."""
    out = tmp_path_factory.mktemp("finished") / "run"
    trainer = make_trainer(model_path, out, "periodic")
    trainer.train()
    return out, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.fixture
def run_copy(tmp_path, finished):
    out = tmp_path / "run"
    shutil.copytree(finished[0], out)
    return out


def resume(model_path, out, checkpoint=True, reference="periodic", **overrides):
    trainer = make_trainer(model_path, out, reference, **overrides)
    trainer.train(resume_from_checkpoint=checkpoint if checkpoint is True else str(out / checkpoint))
    return trainer


def test_manifest_lists_what_the_checkpoint_holds(finished):
    directory = finished[0] / "checkpoint-3"
    manifest = json.loads((directory / ckpt.MANIFEST_FILE).read_text())
    assert manifest["format"] == ckpt.FORMAT_VERSION and manifest["global_step"] == 3
    assert (manifest["world_size"], manifest["steps_per_generation"], manifest["rpg_reference"]) == (1, 4, "periodic")
    assert manifest["rank_files"] == [[BUFFER_META, BUFFER]]
    assert manifest["buffer_rows"] == [[8, 8, 8, 8]]  # one process, 4 buffered micro-batches of 8 completions
    on_disk = {os.path.relpath(os.path.join(r, n), directory) for r, _, names in os.walk(directory) for n in names}
    assert set(manifest["files"]) == on_disk - {ckpt.MANIFEST_FILE}
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json", "rpg_state.json", ckpt.REFERENCE_FILE):
        assert manifest["files"][name]["size"] == os.path.getsize(directory / name)
    for name, record in manifest["files"].items():  # every file, transformers' too, has its checksum
        assert record["sha256"] == hashlib.sha256((directory / name).read_bytes()).hexdigest(), name
    run = manifest["run"]
    assert run["rpg_reference"] == "periodic" and run["model"]["peft"] is None and run["model"]["tensors"] > 10
    assert run["schedule"]["learning_rate"] == 1e-2 and run["batch"]["steps_per_generation"] == 4
    assert run["objective"]["beta"] == 0.05 and manifest["save_only_model"] is False
    assert not (directory / ckpt.WRITING_FILE).exists()


@pytest.mark.parametrize("name", ["rpg_state.json", ckpt.REFERENCE_FILE, BUFFER, BUFFER_META, "optimizer.pt",
                                  "model.safetensors"])
def test_a_missing_file_is_refused_naming_it(model_path, run_copy, name):
    os.remove(run_copy / "checkpoint-3" / name)
    with pytest.raises(CheckpointError, match=f"{name}.* is missing"):
        resume(model_path, run_copy, "checkpoint-3")


def test_resume_true_falls_back_to_the_previous_complete_checkpoint(model_path, run_copy, finished, caplog):
    """checkpoint-6 lost its buffer: resume from checkpoint-3 instead, with a warning naming the missing file, and
    end exactly where the uninterrupted run ended."""
    os.remove(run_copy / "checkpoint-6" / BUFFER)
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainers.trainer"):
        trainer = resume(model_path, run_copy, True)
    assert any("checkpoint-6" in r.getMessage() and BUFFER in r.getMessage() for r in caplog.records)
    assert trainer.state.global_step == 6
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(param.detach(), finished[1][name], rtol=0, atol=1e-6, msg=name)


def test_a_truncated_file_is_refused_naming_it(model_path, run_copy):
    path = run_copy / "checkpoint-3" / BUFFER
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=f"{BUFFER} is {len(data) // 2} bytes.*truncated"):
        resume(model_path, run_copy, "checkpoint-3")


def test_a_corrupted_rpg_file_is_refused_naming_it(model_path, run_copy):
    path = run_copy / "checkpoint-3" / "rpg_state.json"
    data = bytearray(path.read_bytes())
    data[data.index(b"reference_updates")] = ord("R")  # same size, different content
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="rpg_state.json does not match the checksum"):
        resume(model_path, run_copy, "checkpoint-3")


class _Payload:
    """Unpickling this runs code: it creates a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_tampered_buffer_cannot_run_code(model_path, run_copy, tmp_path):
    """Someone else's checkpoint (e.g. downloaded to resume) with a pickle where the buffer belongs, and a manifest
    rewritten to match it: it is refused naming the file, and the pickle never runs."""
    directory = run_copy / "checkpoint-3"
    marker = tmp_path / "code_ran"
    torch.save({"step": 3, "buffer": _Payload(str(marker))}, directory / BUFFER)
    manifest = json.loads((directory / ckpt.MANIFEST_FILE).read_text())
    manifest["files"][BUFFER] = ckpt.file_record(str(directory / BUFFER))
    (directory / ckpt.MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=f"generation buffer of process 0 is damaged.*{BUFFER}"):
        resume(model_path, run_copy, "checkpoint-3")
    assert not marker.exists()


@pytest.mark.parametrize("saved,resumed", [("periodic", "sampling"), ("sampling", "periodic")])
def test_resuming_with_another_reference_schedule_is_an_error(model_path, tmp_path, saved, resumed):
    out = tmp_path / "run"
    make_trainer(model_path, out, saved, max_steps=3).train()
    with pytest.raises(ScheduleMismatch, match=f"rpg_reference='{saved}'; this run has rpg_reference='{resumed}'"):
        resume(model_path, out, True, reference=resumed)


def test_a_checkpoint_of_the_old_format_is_refused(model_path, run_copy):
    marker = run_copy / "checkpoint-3" / ckpt.MANIFEST_FILE
    marker.write_text(json.dumps({"global_step": 3, "world_size": 1}))  # trl-rpg 0.1's marker
    with pytest.raises(CheckpointError, match="checkpoint format 1"):
        resume(model_path, run_copy, "checkpoint-3")


def test_a_changed_batch_layout_regenerates_the_buffer_with_a_warning(model_path, run_copy, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_rpg.run.checkpoint"):
        trainer = resume(model_path, run_copy, "checkpoint-3", steps_per_generation=2)
    assert any("regenerated (steps_per_generation changed from 4 to 2)" in r.getMessage() for r in caplog.records)
    assert trainer.state.global_step == 6


# ------------------------------------------------------------------------------------------------------------------
# Restoring buffers on another number of processes (the plan and the split; the 2-process runs are in
# tests/test_distributed.py)
# ------------------------------------------------------------------------------------------------------------------


def _manifest(world_size, rows, spg=2):
    return {"world_size": world_size, "steps_per_generation": spg, "buffer_rows": rows,
            "buffer_fields": [[] for _ in rows]}


@pytest.mark.parametrize("manifest,world,spg,action", [
    (_manifest(1, [[8, 8]]), 1, 2, "own"),
    (_manifest(1, [[8, 8]]), 2, 2, "redistribute"),
    (_manifest(2, [[4, 4], [4, 4]]), 1, 2, "redistribute"),
    (_manifest(1, [[8, 8]]), 3, 2, "drop"),  # 8 rows do not split over 3 processes
    (_manifest(1, [[8, 8]]), 1, 4, "drop"),  # another number of micro-batches per generation batch
    (_manifest(2, [None, None]), 1, 2, "none"),  # nothing was buffered
    (_manifest(2, [[4, 4], None]), 1, 2, "drop"),  # one process's rows are missing: regenerate
    (_manifest(2, [None, [4, 4]]), 1, 2, "drop"),
])
def test_buffer_restore_plan(manifest, world, spg, action):
    assert ckpt.plan_buffer_restore(manifest, world, spg).action == action


def test_redistribution_keeps_each_micro_batch_together():
    """Each new process gets its share of the same global micro-batch, re-padded: every optimizer step trains on
    the rows it would have trained on."""
    def chunk(rows, width, first):
        ids = torch.arange(first, first + rows * width).reshape(rows, width)
        return {"prompt_ids": ids, "prompt_mask": torch.ones_like(ids), "completion_ids": ids,
                "completion_mask": torch.ones_like(ids), "advantages": torch.arange(first, first + rows).float(),
                "num_items_in_batch": torch.tensor(99.0)}

    old = [[chunk(2, 3, 0), chunk(2, 3, 100)], [chunk(2, 5, 1000), chunk(2, 5, 2000)]]  # 2 old processes
    new = ckpt.redistribute(old, 1, 0, pad_token_id=-1)
    assert [c["advantages"].tolist() for c in new] == [[0, 1, 1000, 1001], [100, 101, 2000, 2001]]
    assert new[0]["completion_ids"].shape == (4, 5) and new[0]["completion_ids"][0, 3:].tolist() == [-1, -1]
    assert new[0]["prompt_ids"][0, :2].tolist() == [-1, -1]  # prompts are padded on the left
    assert float(new[0]["num_items_in_batch"]) == 99.0  # the generation batch's token count is global
    split = [ckpt.redistribute([[c] for c in [new[0]]], 2, r, pad_token_id=-1)[0] for r in range(2)]
    assert [s["advantages"].tolist() for s in split] == [[0, 1], [1000, 1001]]


# ------------------------------------------------------------------------------------------------------------------
# Every file verified, nothing outside the folder read (issue 20, section 2)
# ------------------------------------------------------------------------------------------------------------------


def _rewrite_manifest(directory, change):
    path = directory / ckpt.MANIFEST_FILE
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def test_permuted_weights_of_the_same_size_are_refused(model_path, run_copy):
    path = run_copy / "checkpoint-3" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-4096:] = data[-4096:][::-1]  # same size, weights permuted
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors does not match the checksum"):
        resume(model_path, run_copy, "checkpoint-3")


def test_a_zeroed_region_of_the_optimizer_is_refused(model_path, run_copy):
    path = run_copy / "checkpoint-3" / "optimizer.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2: len(data) // 2 + 256] = bytes(256)
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="optimizer.pt does not match the checksum"):
        resume(model_path, run_copy, "checkpoint-3")


def test_a_symlinked_file_is_refused(model_path, run_copy):
    """checkpoint-3's weights replaced by a link to checkpoint-6's (same size): refused, naming the link."""
    target = run_copy / "checkpoint-3" / "model.safetensors"
    os.remove(target)
    os.symlink(run_copy / "checkpoint-6" / "model.safetensors", target)
    with pytest.raises(CheckpointError, match="model.safetensors is a symbolic link"):
        resume(model_path, run_copy, "checkpoint-3")


def test_trainer_state_at_another_step_is_refused(model_path, run_copy):
    """trainer_state.json edited to step 6 and its checksum updated in the manifest: the step check refuses it."""
    directory = run_copy / "checkpoint-3"
    state = json.loads((directory / "trainer_state.json").read_text())
    state["global_step"] = 6
    (directory / "trainer_state.json").write_text(json.dumps(state))
    _rewrite_manifest(directory, lambda m: m["files"].update(
        {"trainer_state.json": ckpt.file_record(str(directory / "trainer_state.json"))}))
    with pytest.raises(CheckpointError, match="trainer_state.json is at step 6, the checkpoint's manifest at step 3"):
        resume(model_path, run_copy, "checkpoint-3")


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/passwd", "sub/../../outside.bin", "./model.safetensors"])
def test_file_names_outside_the_folder_are_refused_unread(model_path, run_copy, name):
    (run_copy / "outside.bin").write_bytes(b"x" * 12345)
    _rewrite_manifest(run_copy / "checkpoint-3", lambda m: m["files"].update({name: {"size": 1, "sha256": "0"}}))
    with pytest.raises(ckpt.ManifestError, match="lists a file outside the checkpoint folder") as error:
        resume(model_path, run_copy, "checkpoint-3")
    assert "12345" not in str(error.value) and str(os.path.getsize("/etc/passwd")) not in str(error.value)


@pytest.mark.parametrize("change,key", [
    (lambda m: m.pop("files"), "'files'"),
    (lambda m: m.update(files=list(m["files"])), "'files'"),
    (lambda m: m.update(world_size="1"), "'world_size'"),
    (lambda m: m.update(buffer_rows=[[8, 8, 8, 8], [8]]), "'buffer_rows'"),
    (lambda m: m["run"].pop("model"), "'run'"),
    (lambda m: m["files"]["optimizer.pt"].pop("sha256"), "'files'"),
])
def test_a_malformed_manifest_is_a_checkpoint_error_naming_the_key(finished, tmp_path, change, key):
    manifest = json.loads((finished[0] / "checkpoint-3" / ckpt.MANIFEST_FILE).read_text())
    change(manifest)
    with pytest.raises(ckpt.ManifestError, match=f"is malformed: {key}"):
        ckpt.validate_manifest(manifest, str(tmp_path))


def test_resume_true_passes_over_a_malformed_manifest(model_path, run_copy, caplog):
    _rewrite_manifest(run_copy / "checkpoint-6", lambda m: m.update(files=list(m["files"])))
    with caplog.at_level(logging.WARNING):
        trainer = resume(model_path, run_copy, True)
    assert trainer.state.global_step == 6
    assert any("checkpoint-6" in r.getMessage() and "malformed" in r.getMessage() for r in caplog.records)


def test_when_no_checkpoint_passes_the_error_names_each_and_why(model_path, run_copy):
    os.remove(run_copy / "checkpoint-6" / BUFFER)
    os.remove(run_copy / "checkpoint-3" / ckpt.MANIFEST_FILE)
    with pytest.raises(CheckpointError) as error:
        resume(model_path, run_copy, True)
    message = str(error.value)
    assert "No checkpoint in output_dir=" in message
    assert f"- checkpoint-6: {run_copy / 'checkpoint-6' / BUFFER} is missing" in message
    assert "- checkpoint-3: " in message and "interrupted while being written" in message


# ------------------------------------------------------------------------------------------------------------------
# Distinct errors: no such path, not an RPG checkpoint, interrupted
# ------------------------------------------------------------------------------------------------------------------


def test_no_such_path(model_path, run_copy):
    with pytest.raises(ckpt.NoSuchCheckpoint, match="checkpoint-9'?: no such folder"):
        resume(model_path, run_copy, "checkpoint-9")


def test_a_trainer_checkpoint_is_not_an_rpg_checkpoint(model_path, run_copy):
    directory = run_copy / "checkpoint-3"  # what GRPOTrainer writes: transformers' files only
    for name in os.listdir(directory):
        if name.startswith("rpg_"):
            os.remove(directory / name)
    with pytest.raises(ckpt.NotAnRPGCheckpoint, match="probably written by GRPOTrainer or transformers' Trainer"):
        resume(model_path, run_copy, "checkpoint-3")


@pytest.mark.parametrize("inside_trl_save", [False, True])
def test_an_interrupted_write_says_so(model_path, run_copy, inside_trl_save):
    """Killed before the manifest, or inside TRL's save before any RPG file (only the writing marker tells it from a
    GRPOTrainer checkpoint)."""
    directory = run_copy / "checkpoint-3"
    for name in os.listdir(directory):
        if name == ckpt.MANIFEST_FILE or inside_trl_save and name.startswith("rpg_"):
            os.remove(directory / name)
    if inside_trl_save:
        (directory / ckpt.WRITING_FILE).write_text("{}")
    with pytest.raises(ckpt.IncompleteCheckpoint, match="interrupted while being written"):
        resume(model_path, run_copy, "checkpoint-3")


# ------------------------------------------------------------------------------------------------------------------
# The run's own checkpoint: identity recorded and compared
# ------------------------------------------------------------------------------------------------------------------


def test_a_changed_learning_rate_is_named_and_ignored(model_path, run_copy, finished, caplog):
    """The restored scheduler keeps the checkpoint's learning rate: the warning says so, and the resumed run ends
    where the uninterrupted one did."""
    with caplog.at_level(logging.WARNING):
        trainer = resume(model_path, run_copy, "checkpoint-3", learning_rate=5e-2, beta=0.1)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "learning_rate 0.01 -> 0.05 (ignored: the optimizer and scheduler restored" in text
    assert "beta 0.05 -> 0.1 (the objective changes from this step on)" in text
    assert trainer.state.global_step == 6 and trainer.optimizer.param_groups[0]["initial_lr"] == 1e-2


def test_another_runs_checkpoint_with_a_higher_number_is_refused(model_path, run_copy, tmp_path):
    """Another run (another model) wrote checkpoint-100 into the same output_dir: resume_from_checkpoint=True
    refuses it naming both models, rather than resuming it or silently taking this run's older one."""
    other = save_tiny_model(str(tmp_path / "other_model"), hidden_size=16)
    make_trainer(other, tmp_path / "other", "periodic", max_steps=3).train()
    shutil.copytree(tmp_path / "other" / "checkpoint-3", run_copy / "checkpoint-100")
    with pytest.raises(ckpt.RunMismatch, match=f"checkpoint-100 was written for another model: .* model '{other}'"):
        resume(model_path, run_copy, True)


def test_lora_and_full_fine_tuning_checkpoints_are_not_mixed(model_path, run_copy, tmp_path):
    with pytest.raises(ckpt.RunMismatch, match="trains the full model; this run trains a PEFT \\(LORA\\) adapter"):
        resume(model_path, run_copy, "checkpoint-3", lora=True)
    make_trainer(model_path, tmp_path / "lora", "periodic", lora=True, max_steps=3).train()
    with pytest.raises(ckpt.RunMismatch, match="trains a PEFT \\(LORA\\) adapter; this run trains the full model"):
        resume(model_path, tmp_path / "lora", True)


def test_a_save_only_model_checkpoint_is_refused_naming_the_field(model_path, tmp_path):
    out = tmp_path / "run"
    make_trainer(model_path, out, "periodic", max_steps=3, save_only_model=True).train()
    with pytest.raises(CheckpointError, match="written with save_only_model=True: it holds the model weights but no "
                                              "optimizer"):
        resume(model_path, out, "checkpoint-3", save_only_model=True)


# ------------------------------------------------------------------------------------------------------------------
# Writing: rotation, a full disk, fsync before the manifest
# ------------------------------------------------------------------------------------------------------------------


def test_rotation_keeps_the_newest_complete_checkpoint_past_a_stale_incomplete_one(model_path, tmp_path):
    out = tmp_path / "run"
    stale = out / "checkpoint-100"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"stale")
    make_trainer(model_path, out, "periodic", save_total_limit=1).train()
    assert ckpt.last_complete_checkpoint(str(out)).endswith("checkpoint-6")
    assert not (out / "checkpoint-3").exists() and stale.exists()  # the stale folder is neither counted nor deleted


def test_rotation_unit(tmp_path):
    """Only this run's folders are considered and only complete checkpoints count; the one just written and the
    best are always kept; an incomplete folder of this run below the newest is deleted, one above it left; another
    run's checkpoint and a folder no run recorded are left."""
    for step, marker, run in [(1, ckpt.MANIFEST_FILE, "mine"), (2, ckpt.WRITING_FILE, "mine"),
                              (3, ckpt.MANIFEST_FILE, "mine"), (4, ckpt.MANIFEST_FILE, "mine"),
                              (5, ckpt.MANIFEST_FILE, "other"), (7, None, None), (9, ckpt.WRITING_FILE, "mine")]:
        (tmp_path / f"checkpoint-{step}").mkdir()
        if marker:
            (tmp_path / f"checkpoint-{step}" / marker).write_text(json.dumps(
                {"run_id": run, "written_at": step, "started_at": step}))
    deleted = ckpt.rotate(str(tmp_path), 2, str(tmp_path / "checkpoint-4"), "mine",
                          best=str(tmp_path / "checkpoint-1"))
    assert sorted(os.path.basename(p) for p in deleted) == ["checkpoint-2", "checkpoint-3"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1", "checkpoint-4", "checkpoint-5", "checkpoint-7",
                                            "checkpoint-9"]


def test_a_full_disk_in_the_second_save_keeps_the_first_checkpoint(model_path, tmp_path, monkeypatch):
    """save_total_limit=1 and the RPG save failing (disk full) on checkpoint-6: the error says the disk is full and
    where, and checkpoint-3, complete, survives and resumes (TRL's rotation, inside its save, would have deleted it
    before checkpoint-6 was complete)."""
    out = tmp_path / "run"
    trainer = make_trainer(model_path, out, "periodic", save_total_limit=1)
    original = ckpt.save_state

    def full_disk(directory, state):
        if directory.endswith("checkpoint-6"):
            raise OSError(errno.ENOSPC, "No space left on device")
        original(directory, state)

    monkeypatch.setattr(ckpt, "save_state", full_disk)
    with pytest.raises(ckpt.CheckpointDiskFull, match=f"disk holding {out / 'checkpoint-6'} is full"):
        trainer.train()
    assert ckpt.last_complete_checkpoint(str(out)).endswith("checkpoint-3")
    assert (out / "checkpoint-6" / ckpt.WRITING_FILE).exists()
    monkeypatch.setattr(ckpt, "save_state", original)
    with pytest.raises(ckpt.IncompleteCheckpoint):
        resume(model_path, out, "checkpoint-6")
    assert resume(model_path, out, True).state.global_step == 6


def test_torch_s_disk_full_error_is_explained(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt.files, "_free_bytes", lambda path: 0)
    with pytest.raises(ckpt.CheckpointDiskFull, match=r"disk holding .*checkpoint-6 is full \(0 bytes free\).*"
                                                      "unexpected pos 64 vs 0"):
        with ckpt.explain_disk_full(str(tmp_path / "checkpoint-6")):
            raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos 64 vs 0")
    monkeypatch.setattr(ckpt.files, "_free_bytes", lambda path: 1 << 40)
    with pytest.raises(RuntimeError, match="^other$"):  # not a full disk: unchanged
        with ckpt.explain_disk_full(str(tmp_path)):
            raise RuntimeError("other")


def test_every_file_and_folder_is_fsynced_before_the_manifest(tmp_path, monkeypatch, finished):
    directory = tmp_path / "checkpoint-1"
    (directory / "sub").mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(b"w" * 100)
    (directory / "sub" / "shard.pt").write_bytes(b"s" * 10)
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    synced = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (synced.append(f"replace {b}"), real_replace(a, b)))
    own = ckpt.save_generation_buffer(str(directory), 0, 1, None)
    run = json.loads((finished[0] / "checkpoint-3" / ckpt.MANIFEST_FILE).read_text())["run"]
    ckpt.write_manifest(str(directory), 1, 1, run, [own], save_only_model=False, run_id="a-run")
    manifest_written = synced.index(f"replace {directory / ckpt.MANIFEST_FILE}")
    before = set(synced[:manifest_written])
    for path in (directory / "model.safetensors", directory / "sub" / "shard.pt", directory / "trainer_state.json",
                 directory / BUFFER, directory / BUFFER_META, directory, directory / "sub"):
        assert str(path) in before, path


# ------------------------------------------------------------------------------------------------------------------
# A multimodal buffer resumed on another number of processes is regenerated
# ------------------------------------------------------------------------------------------------------------------


def test_a_multimodal_buffer_on_another_number_of_processes_is_regenerated(tmp_path, finished, caplog):
    """`num_images` (a list) and patch-indexed `pixel_values` cannot be split by sample: resumed on 1 process from
    2, the buffered batch is regenerated with a warning naming them (not a crash in the split)."""
    def chunk(rows):
        ids = torch.ones(rows, 3, dtype=torch.long)
        return {"prompt_ids": ids, "prompt_mask": ids, "completion_ids": ids, "completion_mask": ids,
                "advantages": torch.zeros(rows), "num_images": [1] * rows, "pixel_values": torch.zeros(5 * rows, 4)}

    directory = tmp_path / "checkpoint-2"
    (directory).mkdir()
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    reported = [ckpt.save_generation_buffer(str(directory), rank, 2, [chunk(2)] * 4) for rank in range(2)]  # 4 / gen.
    assert reported[0]["fields"] == ["num_images", "pixel_values"]
    run = json.loads((finished[0] / "checkpoint-3" / ckpt.MANIFEST_FILE).read_text())["run"]
    ckpt.write_manifest(str(directory), 2, 2, run, reported, save_only_model=False, run_id="a-run")
    plan = ckpt.plan_buffer_restore(ckpt.read_manifest(str(directory)), 1, 4)
    assert plan.action == "drop" and "num_images, pixel_values cannot be split by sample" in plan.reason
    with caplog.at_level(logging.WARNING, logger="trl_rpg.run.checkpoint"):
        step, buffer = ckpt.restore_buffers(str(directory), 1, 4, 0, pad_token_id=0, device="cpu")
    assert (step, buffer) == (2, None)
    assert any("regenerated" in r.getMessage() and "pixel_values" in r.getMessage() for r in caplog.records)
    step, buffer = ckpt.restore_buffers(str(directory), 2, 4, 1, pad_token_id=0, device="cpu")  # same processes
    assert buffer[0]["num_images"] == [1, 1] and buffer[0]["pixel_values"].shape == (10, 4)
