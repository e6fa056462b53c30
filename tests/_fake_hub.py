"""A stubbed Hub for trainer tests (no network): `HfApi.create_repo`, `upload_folder` and `upload_file` replaced by a
local "repository" folder that records each commit, and can fail every upload (a 503, as the Hub answers when it is
down), or hold every upload until released (`gate`: slow, or never returning until the test ends)."""

import fnmatch
import os
import shutil
import sys
import threading

from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, Response
from huggingface_hub.hf_api import RepoUrl


def service_unavailable() -> HfHubHTTPError:
    """The error huggingface_hub raises when the Hub answers 503."""
    url = "https://huggingface.co/api/models/me/rpg/commit/main"
    http = sys.modules[Response.__module__.split(".")[0]]  # the HTTP library huggingface_hub uses
    response = Response(503, request=http.Request("POST", url))
    return HfHubHTTPError(f"503 Server Error: Service Unavailable for url: {url}", response=response)


def _matches(path: str, patterns) -> bool:
    return any(fnmatch.fnmatch(path, pattern) for pattern in patterns or [])


class FakeHub:
    """`repo`: the repository's files; `commits`: one (kind, path_in_repo, added files, deleted files) per commit,
    in order; `fail`: an exception every upload raises (None: uploads succeed); `gate`: uploads wait until it is set
    (set at first)."""

    def __init__(self, root):
        self.repo = root / "hub_repo"
        self.repo.mkdir(parents=True, exist_ok=True)
        self.commits: list[tuple[str, str, list[str], list[str]]] = []
        self.fail: Exception | None = None
        self.gate = threading.Event()
        self.gate.set()

    def install(self, monkeypatch) -> "FakeHub":
        hub = self

        def create_repo(self, repo_id, **kwargs):
            return RepoUrl(f"https://huggingface.co/{repo_id}")

        def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, ignore_patterns=None,
                          delete_patterns=None, run_as_future=False, **kwargs):
            assert not run_as_future, "trl-rpg runs uploads in its own worker"
            return hub.upload_folder(folder_path, path_in_repo or "", ignore_patterns, delete_patterns)

        def upload_file(self, *, path_or_fileobj, path_in_repo, repo_id, run_as_future=False, **kwargs):
            assert not run_as_future, "trl-rpg runs uploads in its own worker"
            return hub.upload_file(path_or_fileobj, path_in_repo)

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
        monkeypatch.setattr(HfApi, "upload_file", upload_file)
        return self

    def _enter(self):
        self.gate.wait()
        if self.fail is not None:
            raise self.fail

    def upload_folder(self, folder_path, path_in_repo, ignore_patterns, delete_patterns):
        self._enter()
        target = self.repo / path_in_repo
        added = []
        for root, _, names in os.walk(folder_path):
            for name in names:
                relative = os.path.relpath(os.path.join(root, name), folder_path)
                if not _matches(relative, ignore_patterns):
                    added.append(relative)
        deleted = []
        if delete_patterns and target.exists():
            for root, _, names in os.walk(target):
                for name in names:
                    relative = os.path.relpath(os.path.join(root, name), target)
                    if _matches(relative, delete_patterns) and relative not in added:
                        os.remove(os.path.join(root, name))
                        deleted.append(relative)
        for relative in added:
            os.makedirs(target / os.path.dirname(relative), exist_ok=True)
            shutil.copy(os.path.join(folder_path, relative), target / relative)
        self.commits.append(("folder", path_in_repo, sorted(added), sorted(deleted)))

    def upload_file(self, path_or_fileobj, path_in_repo):
        self._enter()
        os.makedirs((self.repo / path_in_repo).parent, exist_ok=True)
        shutil.copy(path_or_fileobj, self.repo / path_in_repo)
        self.commits.append(("file", path_in_repo, [os.path.basename(path_in_repo)], []))
