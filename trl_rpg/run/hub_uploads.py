"""The Hub uploads of a run (`push_to_hub=True`, any `hub_strategy` but `"end"`): every upload's result read, a
checkpoint kept until its upload is done, the last checkpoint pushed at the end, a checkpoint's manifest uploaded
last in a commit of its own, and a bounded final wait.

transformers' `Trainer._push_from_checkpoint` queues each save's uploads (`HfApi.upload_folder(run_as_future=True)`:
the model from `output_dir`, and with `hub_strategy="checkpoint"` / `"all_checkpoints"` the checkpoint folder),
skips a save while an earlier upload runs (unless `hub_always_push`), and never reads the result: every upload can
fail (a 503) and `train()` still succeeds; its final wait (`_finish_current_push`) has no bound. RPGTrainer still
calls it, keeping its rules (which files, commit messages, `hub_strategy`, `hub_always_push`), with transformers'
`hf_api()` answered for the call by `_RecordingApi` (`_compat.trainer_hub_api`), and `HubUploads` does the rest:

- **Each upload runs in one worker thread**, in the order queued, as huggingface_hub runs them; the thread is a
  daemon, so an upload that never returns does not keep the process from exiting.
- **A checkpoint's upload** is two commits: the folder without its manifest, deleting in the same (first) commit
  every file of the Hub folder that the checkpoint does not hold (the previous manifest of `last-checkpoint/`
  included; huggingface_hub may split a large folder over several commits, and deletions ride the first); then,
  once that succeeded, the manifest alone. The Hub never shows a manifest beside a partial checkpoint, and a Hub
  folder holds exactly one checkpoint's files.
- **Results are read** at every save and at the end: a failed upload is logged as a warning with its cause.
- **Rotation keeps a checkpoint whose upload is queued or running** (`uploading`), and rotates again at the end.
- **At the end** (`finish`: transformers' final wait, and before `push_to_hub()`'s own upload) it waits at most
  `rpg_hub_upload_timeout` seconds, then pushes the run's last checkpoint if transformers skipped it (an upload was
  running) or its upload failed (once more), and waits again within the same bound. `final_error` then says whether
  the last checkpoint's uploads never succeeded or are still running: `RPGTrainer.train()` raises `HubUploadError`
  with it (the training itself is complete, the checkpoint kept locally).
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from .checkpoint.layout import MANIFEST_FILE

logger = logging.getLogger(__name__)


#: The help of both configs' `rpg_hub_upload_timeout` (RPGConfig, AsyncRPGConfig).
TIMEOUT_HELP = ("Seconds the end of training waits for Hub uploads still running before train() fails naming them; "
                "None: no bound (transformers').")


class HubUploadError(RuntimeError):
    """The run's last checkpoint never reached the Hub: its upload failed, or was still running at the bound."""


@dataclass
class Upload:
    """One queued upload: what it sends (`what`), for the save of `step`, into `repo_id`."""

    what: str
    step: int
    repo_id: str
    future: Future
    checkpoint: str | None = None  #: the local checkpoint folder it reads (kept until the upload is done)
    reported: bool = False

    @property
    def failed(self) -> bool:
        return self.future.done() and self.future.exception() is not None

    def cause(self) -> str:
        error = self.future.exception()
        return f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"


class UploadWorker:
    """Runs upload jobs one after another in a daemon thread (started at the first job); each job's `Future`."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], object]) -> Future:
        future: Future = Future()
        self._jobs.put((future, job))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trl-rpg hub uploads", daemon=True)
            self._thread.start()
        return future

    def _run(self) -> None:
        while True:
            future, job = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as error:  # handed to whoever reads the future
                future.set_exception(error)


def upload_checkpoint(api, *, folder_path: str, path_in_repo: str, repo_id: str, commit_message: str | None = None,
                      ignore_patterns=None, **kwargs):
    """Upload checkpoint folder `folder_path` to `path_in_repo` in two commits: every file but the manifest (deleting
    the Hub folder's other files in the first commit), then the manifest alone."""
    api.upload_folder(folder_path=folder_path, path_in_repo=path_in_repo, repo_id=repo_id,
                      commit_message=commit_message, ignore_patterns=[*(ignore_patterns or []), MANIFEST_FILE],
                      delete_patterns=["*"], **kwargs)
    common = {key: kwargs[key] for key in ("token", "revision", "repo_type") if key in kwargs}
    return api.upload_file(path_or_fileobj=os.path.join(folder_path, MANIFEST_FILE),
                           path_in_repo=f"{path_in_repo.rstrip('/')}/{MANIFEST_FILE}", repo_id=repo_id,
                           commit_message=f"{commit_message or 'Checkpoint'}, manifest", **common)


class _RecordingApi:
    """transformers' `HfApi` during one `_push_from_checkpoint` call: `upload_folder` runs in the worker (a
    checkpoint folder as `upload_checkpoint`) and is recorded; everything else is the real API's."""

    def __init__(self, api, uploads: HubUploads, save: _Save):
        self._api, self._uploads, self._save = api, uploads, save

    def __getattr__(self, name):
        return getattr(self._api, name)

    def upload_folder(self, *, folder_path, run_as_future=False, **kwargs):
        is_checkpoint = os.path.abspath(folder_path) == os.path.abspath(self._save.folder)
        if is_checkpoint:
            job = functools.partial(upload_checkpoint, self._api, folder_path=folder_path, **kwargs)
            what = f"{os.path.basename(os.path.normpath(folder_path))} (to {kwargs.get('path_in_repo')}/)"
        else:
            job = functools.partial(self._api.upload_folder, folder_path=folder_path, **kwargs)
            what = f"the model of step {self._save.step}"
        upload = Upload(what, self._save.step, kwargs.get("repo_id"), self._uploads.worker.submit(job),
                        folder_path if is_checkpoint else None)
        self._uploads.uploads.append(upload)
        self._save.uploads.append(upload)
        if run_as_future:
            return upload.future
        return upload.future.result()


@dataclass
class _Save:
    """A save pushed (or skipped) by `_push_from_checkpoint`: its step, its folder, the uploads queued for it."""

    step: int
    folder: str
    uploads: list[Upload] = field(default_factory=list)


@dataclass
class HubUploads:
    """The Hub uploads of one run on the process that pushes (`active`: `push_to_hub`, a `hub_strategy` other than
    `"end"`, the main process), and the end-of-run wait bounded by `timeout` seconds (None: no bound); `trainer`
    names the trainer in its warnings and errors."""

    active: bool
    timeout: float | None
    trainer: str = "RPGTrainer"
    uploads: list[Upload] = field(default_factory=list)
    worker: UploadWorker = field(default_factory=UploadWorker)
    last_save: _Save | None = None
    _rotation: Callable | None = None
    _retried: set[int] = field(default_factory=set)

    def recorder(self, checkpoint_folder: str, step: int) -> Callable[[object], _RecordingApi]:
        """Record a push of the save of `step` (made now, whether or not transformers uploads anything for it), and
        the API its `_push_from_checkpoint` uses for it, from the real one (for `_compat.trainer_hub_api`)."""
        save = self.last_save = _Save(step, checkpoint_folder)
        return lambda api: _RecordingApi(api, self, save)

    def uploading(self) -> list[str]:
        """The checkpoint folders an upload still reads (queued or running)."""
        return [u.checkpoint for u in self.uploads if u.checkpoint is not None and not u.future.done()]

    def rotate(self, rotation: Callable) -> None:
        """Rotate checkpoints (`rotation(keep=...)`, `checkpoint.rotate` bound to this save) keeping those still
        uploading; `finish` calls it again once they are done."""
        self._rotation = rotation
        rotation(keep=self.uploading())

    def report(self) -> list[Upload]:
        """Warn, once each, about the uploads that failed since the last report; returns them."""
        failed = [u for u in self.uploads if not u.reported and u.failed]
        for upload in failed:
            upload.reported = True
            logger.warning("%s: the Hub upload of %s (step %d) to %s failed: %s. %s", self.trainer, upload.what,
                           upload.step, upload.repo_id, upload.cause(), "The checkpoint is kept locally; the run "
                           "pushes its last checkpoint again at the end, and fails then if it never reaches the Hub.")
        return failed

    def finish(self, push: Callable[[str], None]) -> None:
        """The end-of-run wait: at most `timeout` seconds in all; the last checkpoint pushed (`push(folder)`) if no
        upload of it was queued or one failed (once); failures reported; checkpoints kept for uploads rotated."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self._wait(deadline)
        last = self.last_save
        if self.active and last is not None and not self._running() and last.step not in self._retried:
            mine = last.uploads
            if not mine or any(u.failed for u in mine):
                self._retried.add(last.step)
                self.report()
                logger.warning("%s: pushing the last checkpoint (%s) to the Hub at the end of training: %s.",
                               self.trainer, last.folder, "its upload failed" if mine else
                               "transformers skipped its upload while an earlier one was running")
                push(last.folder)
                self._wait(deadline)
        self.report()
        if self._rotation is not None and not self.uploading():
            self._rotation(keep=[])

    def final_error(self) -> str | None:
        """Why the run's last checkpoint is not on the Hub (failed, or still uploading at the bound), or None."""
        last = self.last_save
        if not self.active or last is None:
            return None
        running = [u for u in self.uploads if not u.future.done()]
        mine = last.uploads  # its latest push
        failed = [u for u in mine if u.failed]
        if not running and mine and not failed:
            return None
        repo = next((u.repo_id for u in reversed(self.uploads)), "the Hub repository")
        held = [u.step for u in self.uploads if u.future.done() and not u.failed]
        holds = f"its newest upload that succeeded is of step {max(held)}" if held else "no upload of this run " \
                                                                                       "succeeded"
        if running:
            what = (f"after waiting {self.timeout:g} s (rpg_hub_upload_timeout) these uploads are still running: "
                    f"{', '.join(f'{u.what} (step {u.step})' for u in running)}; they go on in the background while "
                    "this process runs")
        elif failed:
            what = "; ".join(f"the upload of {u.what} failed: {u.cause()}" for u in failed)
        else:
            what = "it was never uploaded"
        return (f"{self.trainer}: the last checkpoint of the run, step {last.step}, did not reach the Hub ({repo}): "
                f"{what}. On the Hub, {holds}. Training itself completed; the checkpoint is kept in {last.folder}: "
                "push it with `trainer.push_to_hub()` (the model) or `huggingface-cli upload` (the folder).")

    def _running(self) -> bool:
        return any(not u.future.done() for u in self.uploads)

    def _wait(self, deadline: float | None) -> None:
        for upload in list(self.uploads):
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                upload.future.exception(timeout=remaining)
            except TimeoutError:
                return


__all__ = ["TIMEOUT_HELP", "HubUploadError", "HubUploads", "Upload", "UploadWorker", "upload_checkpoint"]
