"""A checkpoint is resumed only if it is whole: the manifest lists what it holds, resume verifies it, and a damaged,
incomplete, tampered or mismatched checkpoint is refused with an error naming the problem (or, with
`resume_from_checkpoint=True`, skipped for the previous complete one with a warning). Nothing is unpickled.

One run (periodic reference, checkpoints at steps 3 and 6, 4 optimizer steps per generation batch so both
checkpoints fall inside a reused batch) is trained once; each test damages a copy of its output directory.
"""

import json
import logging
import os
import shutil

import pytest
import torch
from _resume_script import make_trainer
from _tiny import save_tiny_model

from trl_rpg import checkpoint as ckpt
from trl_rpg.checkpoint import CheckpointError, ScheduleMismatch

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
    assert "sha256" in manifest["files"][BUFFER] and "sha256" in manifest["files"]["rpg_state.json"]


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
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainer"):
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
    manifest["files"][BUFFER] = ckpt.file_record(str(directory / BUFFER), with_hash=True)
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
    with caplog.at_level(logging.WARNING, logger="trl_rpg.checkpoint"):
        trainer = resume(model_path, run_copy, "checkpoint-3", steps_per_generation=2)
    assert any("regenerated (steps_per_generation changed from 4 to 2)" in r.getMessage() for r in caplog.records)
    assert trainer.state.global_step == 6


# ------------------------------------------------------------------------------------------------------------------
# Restoring buffers on another number of processes (the plan and the split; the 2-process runs are in
# tests/test_distributed.py)
# ------------------------------------------------------------------------------------------------------------------


def _manifest(world_size, rows, spg=2):
    return {"world_size": world_size, "steps_per_generation": spg, "buffer_rows": rows}


@pytest.mark.parametrize("manifest,world,spg,action", [
    (_manifest(1, [[8, 8]]), 1, 2, "own"),
    (_manifest(1, [[8, 8]]), 2, 2, "redistribute"),
    (_manifest(2, [[4, 4], [4, 4]]), 1, 2, "redistribute"),
    (_manifest(1, [[8, 8]]), 3, 2, "drop"),  # 8 rows do not split over 3 processes
    (_manifest(1, [[8, 8]]), 1, 4, "drop"),  # another number of micro-batches per generation batch
    (_manifest(2, [None, None]), 1, 2, "none"),  # nothing was buffered
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
