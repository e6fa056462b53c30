"""What a save writes: a full disk or an exceeded quota is explained; `rpg_save_generation_buffer=False` saves no
buffered batch (issue 30, section 2)."""

import errno

import pytest
from _resume_script import make_trainer
from _tiny import save_tiny_model

from trl_rpg.run import checkpoint as ckpt


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


@pytest.mark.parametrize(("code", "said"), [(errno.ENOSPC, "The disk holding {} is full"),
                                            (errno.EDQUOT, "Your disk quota is exceeded on the disk holding {}")])
def test_no_space_and_an_exceeded_quota_are_explained_with_space_left_on_the_disk(tmp_path, monkeypatch, code, said):
    """A quota (or the inodes) can run out while the disk has space: the error number decides, not the free bytes."""
    monkeypatch.setattr(ckpt.files, "_free_bytes", lambda path: 1 << 40)
    directory = tmp_path / "checkpoint-6"
    with pytest.raises(ckpt.CheckpointDiskFull) as error:
        with ckpt.explain_disk_full(str(directory)):
            raise OSError(code, "No room")
    assert str(error.value).startswith(f"[Errno {code}] {said.format(directory)}")
    assert "The checkpoint is left incomplete" in str(error.value)


@pytest.mark.parametrize("save_buffer", [True, False])
def test_rpg_save_generation_buffer_decides_whether_the_buffered_batch_is_saved(model_path, tmp_path, save_buffer):
    """Checkpoint-3 falls inside a reused generation batch (4 optimizer steps per batch): with the default the
    buffered batch is saved and restored, with rpg_save_generation_buffer=False neither (it is regenerated)."""
    out = tmp_path / "run"
    make_trainer(model_path, out, "periodic", max_steps=3, rpg_save_generation_buffer=save_buffer).train()
    directory = str(out / "checkpoint-3")
    manifest = ckpt.read_manifest(directory)
    step, buffer = ckpt.load_generation_buffer(directory, 0)
    assert step == 3
    if save_buffer:
        assert manifest["buffer_rows"] == [[8, 8, 8, 8]] and len(buffer) == 4  # the batch's 4 micro-batches
    else:
        assert manifest["buffer_rows"] == [None] and buffer is None
        restored = ckpt.restore_buffers(directory, 1, 4, 0, pad_token_id=0, device="cpu")
        assert restored == (3, None)
