"""The layout of an RPG checkpoint folder (its file names, the format version) and the errors of a checkpoint that
cannot be resumed. Every other module of `trl_rpg.run.checkpoint` imports this one; it imports none of them."""

from __future__ import annotations

MANIFEST_FILE = "rpg_checkpoint_complete.json"
WRITING_FILE = "rpg_checkpoint_writing.json"
STATE_FILE = "rpg_state.json"
REFERENCE_FILE = "rpg_reference.safetensors"
BUFFER_TENSORS_FILE = "rpg_generation_buffer_rank{rank}.safetensors"
BUFFER_META_FILE = "rpg_generation_buffer_rank{rank}.json"
TRAINER_STATE_FILE = "trainer_state.json"
#: transformers' gradient scaler state (`Trainer._save_scaler`: runs with an fp16 `GradScaler` only).
SCALER_FILE = "scaler.pt"
#: Version of the layout above. 1: trl-rpg 0.1 (pickled buffers, no file list); 2: sizes, SHA-256 for RPG's files
#: only, no run identity; 3: no run id, DeepSpeed stage or parameter dtypes.
FORMAT_VERSION = 4


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: incomplete, damaged, or written for another setup."""


class NoSuchCheckpoint(CheckpointError):
    """The path given to resume from does not exist (or `output_dir` holds no checkpoint)."""


class NotAnRPGCheckpoint(CheckpointError):
    """A folder that RPGTrainer did not write (e.g. a `GRPOTrainer` or `Trainer` checkpoint)."""


class IncompleteCheckpoint(CheckpointError):
    """A checkpoint whose write was interrupted: it has no manifest."""


class ManifestError(CheckpointError):
    """A manifest that is not one RPGTrainer writes: a missing or mistyped key, a file name outside the folder."""


class ScheduleMismatch(CheckpointError):
    """A checkpoint written with another reference schedule than the run resuming it."""


class RunMismatch(CheckpointError):
    """A checkpoint written by a run whose model cannot take its weights and optimizer (other model, PEFT setup)."""


#: Errors that are refused at once even with `resume_from_checkpoint=True` (the newest checkpoint is another run's:
#: resuming an older one instead would silently pick a checkpoint the user did not mean).
REFUSED_AT_ONCE = (ScheduleMismatch, RunMismatch)
_ERRORS = {cls.__name__: cls for cls in (CheckpointError, NoSuchCheckpoint, NotAnRPGCheckpoint, IncompleteCheckpoint,
                                         ManifestError, ScheduleMismatch, RunMismatch)}


class CheckpointDiskFull(OSError):
    """The disk filled up while a checkpoint was written (the checkpoint is left incomplete, the earlier ones kept)."""
