"""RPG checkpoints: what a checkpoint holds beyond TRL's, how it is written, and how resume verifies it.

A `checkpoint-N` folder written by `RPGTrainer` holds, next to what `Trainer`/`GRPOTrainer` write (weights,
optimizer, scheduler, RNG states, `trainer_state.json`):

- `rpg_state.json`: the reference policy's state (version, updates, moving average) and the skipped-step count;
- `rpg_reference.safetensors`: the moving reference (`rpg_reference="periodic"` or `"adaptive"`), full tensors;
- `rpg_generation_buffer_rank{R}.safetensors` and `.json`: process R's buffered generation batch (tensors; the
  rest as JSON) and its micro-step counter. Nothing is unpickled on resume, so a checkpoint from someone else
  cannot run code;
- `rpg_checkpoint_writing.json` while the checkpoint is being written (written first, removed last), with the run id;
- `rpg_checkpoint_complete.json`, the manifest, written last (atomically) once every process has written and
  fsynced its files: the format version, the run id and the time, step, number of processes, what identifies the
  run (`run_identity`), the buffered batch's layout, and every file of the checkpoint with its size and SHA-256.

Resume (`choose`) verifies, on every process, before transformers reads anything: the manifest's shape; that the run
resuming it is the run that wrote it (`compare_runs`: a changed model, PEFT setup or reference schedule is refused,
other changed settings are named in a warning); that the checkpoint holds the optimizer (not `save_only_model`);
that every listed file is a regular file inside the folder (no symbolic link, no `..`) with its size and SHA-256;
and that `trainer_state.json` is at the manifest's step. A checkpoint that fails is refused naming the file, or,
with `resume_from_checkpoint=True`, passed over for the previous one; when none passes, the error names each
candidate and why.

Rotation (`rotate`) runs only after a manifest is written, never deletes the checkpoint just completed, and counts
only this run's complete checkpoints. One output folder, one run (`runs`): every checkpoint records the id of the run
that wrote it; a save empties its folder first; `resume_from_checkpoint=True` resumes the run that completed a
checkpoint last. Under DeepSpeed, its pickled files are loaded weights-only (`safe_loading`).

The modules, each importing only those above it: `layout` (file names, format version, errors), `files` (hashing,
fsync, atomic JSON, a full disk; RPG's state and reference files), `identity` (the run identity and its comparison),
`runs` (the checkpoint folders of an output_dir and the run that wrote each), `manifest` (write, validate, verify),
`buffers` (each process's generation buffer, saved and restored on any number of processes), `selection` (which
checkpoint to resume from; rotation), `safe_loading` (DeepSpeed's files, weights-only); `lock` (one writer per
output_dir: the lock `train()` holds) imports none of them. Every public name is importable from here.
"""

from .buffers import (
    BufferPlan,
    buffer_ranks_needed,
    load_generation_buffer,
    plan_buffer_restore,
    redistribute,
    restore_buffers,
    save_generation_buffer,
)
from .files import (
    checked_state,
    explain_disk_full,
    file_record,
    file_records,
    fsync_folder,
    fsync_tree,
    load_reference,
    load_state,
    read_json,
    save_reference,
    save_state,
    write_json_atomic,
)
from .identity import (
    IDENTITY_FIELDS,
    RESTORED_WITH_OPTIMIZER,
    check_same_deepspeed_stage,
    compare_runs,
    dtype_change,
    run_identity,
)
from .layout import (
    BUFFER_META_FILE,
    BUFFER_TENSORS_FILE,
    FORMAT_VERSION,
    MANIFEST_FILE,
    REFERENCE_FILE,
    REFUSED_AT_ONCE,
    SCALER_FILE,
    STATE_FILE,
    TRAINER_STATE_FILE,
    WRITING_FILE,
    CheckpointDiskFull,
    CheckpointError,
    IncompleteCheckpoint,
    ManifestError,
    NoSuchCheckpoint,
    NotAnRPGCheckpoint,
    RunMismatch,
    ScheduleMismatch,
)
from .lock import LOCK_FILE, OutputDirBusy, OutputLock, output_dir_lock
from .manifest import (
    begin_checkpoint,
    check_nothing_unlisted,
    check_scaler,
    leftover_marker,
    read_manifest,
    required_files,
    validate_manifest,
    verify_checkpoint,
    write_manifest,
)
from .runs import RUN_STATE_KEY, checkpoint_folders, empty_for_save, run_id, run_of, warn_if_other_runs
from .safe_loading import deepspeed_loads_weights_only
from .selection import (
    check_folder,
    choose,
    is_complete,
    last_complete_checkpoint,
    latest_run_folders,
    resume_checkpoint,
    rotate,
    verify_for_process,
)

__all__ = [
    "BUFFER_META_FILE",
    "BUFFER_TENSORS_FILE",
    "FORMAT_VERSION",
    "IDENTITY_FIELDS",
    "LOCK_FILE",
    "MANIFEST_FILE",
    "REFERENCE_FILE",
    "REFUSED_AT_ONCE",
    "RESTORED_WITH_OPTIMIZER",
    "RUN_STATE_KEY",
    "SCALER_FILE",
    "STATE_FILE",
    "TRAINER_STATE_FILE",
    "WRITING_FILE",
    "BufferPlan",
    "CheckpointDiskFull",
    "CheckpointError",
    "IncompleteCheckpoint",
    "ManifestError",
    "NoSuchCheckpoint",
    "NotAnRPGCheckpoint",
    "OutputDirBusy",
    "OutputLock",
    "RunMismatch",
    "ScheduleMismatch",
    "begin_checkpoint",
    "buffer_ranks_needed",
    "check_folder",
    "check_nothing_unlisted",
    "check_scaler",
    "checked_state",
    "check_same_deepspeed_stage",
    "checkpoint_folders",
    "choose",
    "compare_runs",
    "deepspeed_loads_weights_only",
    "dtype_change",
    "empty_for_save",
    "explain_disk_full",
    "file_record",
    "file_records",
    "fsync_folder",
    "fsync_tree",
    "is_complete",
    "last_complete_checkpoint",
    "latest_run_folders",
    "leftover_marker",
    "load_generation_buffer",
    "load_reference",
    "load_state",
    "output_dir_lock",
    "plan_buffer_restore",
    "read_json",
    "read_manifest",
    "redistribute",
    "required_files",
    "restore_buffers",
    "resume_checkpoint",
    "rotate",
    "run_id",
    "run_identity",
    "run_of",
    "save_generation_buffer",
    "save_reference",
    "save_state",
    "validate_manifest",
    "verify_checkpoint",
    "verify_for_process",
    "warn_if_other_runs",
    "write_json_atomic",
    "write_manifest",
]
