"""The self-check's verdict on the installed TRL: run once in a fresh process, cached per installed version.

`verdict(review, ...)` is what `upgrade_guard.check` asks when the installed TRL's code is not the reviewed code.
The verdict is read from the cache when a run with the same key finished before; otherwise `python -m
trl_rpg.upgrade.verdict` runs the review's properties (`upgrade_check.PROPERTIES`) in a fresh process: no process
group of the run that asked (its RANK / WORLD_SIZE / ACCELERATE_* are dropped), no GPU (`CUDA_VISIBLE_DEVICES=""`),
nothing from the Hub and no telemetry (`HF_HUB_OFFLINE=1`, `HF_HUB_DISABLE_TELEMETRY=1`), the same `sys.path`.

- The key: the versions of trl-rpg, trl, transformers, torch, accelerate and Python, the digests of the reviewed
  methods as installed, the unclassified GRPOConfig fields, the properties and the source of the check itself.
- Where: `$TRL_RPG_CACHE`, else `$XDG_CACHE_HOME/trl-rpg`, else `~/.cache/trl-rpg` (as `HF_HOME` defaults to
  `~/.cache/huggingface`), in `upgrade-check/<key>.json`. A cache that cannot be written is skipped (the check
  runs again next time); several processes asking at once wait on one lock file, so the check runs once.
- Only conclusive verdicts are cached: a property that held or failed. A check that could not run (it crashed, timed
  out after `TIMEOUT_S`, or printed a result that is not one result per property) is "no verdict", with the reason,
  reported as failed and tried again next time.
- A cached file is trusted only when it is strictly a verdict: `passed` a bool equal to every result's, one result
  per requested property, the methods' digests equal to the installed ones; anything else (a string "false", an
  empty list, JSON nested too deep) is a miss and the check runs again. The cache and its lock are opened without
  blocking: a FIFO in their place is not waited on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from . import reviews
from . import self_check as upgrade_check

logger = logging.getLogger(__name__)

#: Marks the result line the check's process prints (the rest of its output is the libraries' logging).
RESULT_PREFIX = "TRL_RPG_SELF_CHECK_RESULT "
#: A hang guard: the check takes seconds.
TIMEOUT_S = 600
#: Set in the check's own process: the trainers it builds must not ask for a verdict again.
IN_CHECK_ENV = "_TRL_RPG_IN_SELF_CHECK"
#: Environment variables of a distributed launch, dropped for the check's process.
_LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
               "TORCHELASTIC_RUN_ID")
VERSIONED = ("trl-rpg", "trl", "transformers", "torch", "accelerate")


@dataclass
class Verdict:
    """`passed`: every property held; `results`: each property's `{"name", "passed", "detail"}`; `error`: why the
    check gave no verdict (then `passed` is False and nothing is cached); `cached`: the file it was read from or
    written to (None: not cached); `fresh`: the check ran for this verdict (not read from the cache)."""

    passed: bool
    results: list[dict] = field(default_factory=list)
    error: str | None = None
    cached: str | None = None
    seconds: float = 0.0
    #: True for the verdict of a check run by this call (False: read from the cache)
    fresh: bool = False

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.results if not r["passed"]]

    def to_json(self) -> dict:
        return {"passed": self.passed, "results": self.results, "seconds": round(self.seconds, 1)}


def installed_versions() -> dict[str, str]:
    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    return {**versions, "python": platform.python_version()}


def cache_dir() -> Path:
    root = os.environ.get("TRL_RPG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "trl-rpg")
    return Path(root) / "upgrade-check"


def cache_key(review: str, digests: dict[str, str], fields: list[str], properties) -> str:
    modules = {p.target.split(":")[0] for p in properties} | {"trl_rpg.upgrade.verdict", "trl_rpg.upgrade.self_check"}
    check_sources = sorted(_file_digest(module) for module in modules)
    material = {"review": review, "versions": installed_versions(), "digests": digests, "fields": sorted(fields),
                "properties": [[p.name, p.target] for p in properties], "check": check_sources}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]


def _file_digest(module: str) -> str:
    import importlib

    path = importlib.import_module(module).__file__
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def results_problem(results, properties) -> str | None:
    """Why `results` are not one `{"name", "passed", "detail"}` per property of `properties`, in order (None when
    they are)."""
    if not isinstance(results, list):
        return f"the results are a {type(results).__name__}, not a list"
    names = [p.name for p in properties]
    if not names or len(results) != len(names):
        return f"{len(results)} results for the {len(names)} properties asked ({', '.join(names) or 'none'})"
    for result, name in zip(results, names):
        if not isinstance(result, dict) or result.get("name") != name:
            return f"a result is not the property {name}'s"
        if not isinstance(result.get("passed"), bool):
            return f"{name}'s 'passed' is not true or false"
        if not isinstance(result.get("detail"), (str, type(None))) or (result["passed"] != (result["detail"] is None)):
            return f"{name}'s detail does not say why it failed (or says something although it held)"
    return None


def _digests_problem(digests) -> str | None:
    if not isinstance(digests, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in
                                                digests.items()):
        return "the methods' digests are not a mapping of names to digests"
    return None


def _read_regular(path: Path, limit: int = 1 << 22) -> str | None:
    """The text of `path` if it is a regular file (opened without blocking: a FIFO is not waited on); None when
    missing, not a regular file or unreadable."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        data = file.read(limit + 1)
    return data.decode("utf-8", errors="replace") if len(data) <= limit else None


def read_cached(key: str, properties=(), digests: dict[str, str] | None = None) -> Verdict | None:
    """The cached verdict for `key`, None (a miss: the check runs again) unless the file is strictly a verdict on
    `properties` for these `digests`: `passed` a bool equal to every result's, one result per property."""
    path = cache_dir() / f"{key}.json"
    text = _read_regular(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        return None
    if not isinstance(data, dict) or not isinstance(data.get("passed"), bool) or results_problem(
            data.get("results"), properties) or data.get("digests") != digests:
        return None
    results = data["results"]
    if data["passed"] != all(r["passed"] for r in results):
        return None
    seconds = data.get("seconds", 0.0)
    return Verdict(passed=data["passed"], results=results, cached=str(path),
                   seconds=float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
                   else 0.0)


def write_cached(key: str, verdict: Verdict, digests: dict[str, str] | None = None) -> str | None:
    """The file written, or None when the cache cannot be written (said once in the log, not an error)."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".{key}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps({**verdict.to_json(), "digests": digests}, indent=1), encoding="utf-8")
        os.replace(temporary, folder / f"{key}.json")
        return str(folder / f"{key}.json")
    except OSError as error:
        logger.info("trl-rpg: the upgrade self-check's verdict is not cached (%s): it runs again next time.", error)
        return None


@contextmanager
def _lock(key: str):
    """One process runs the check; the others wait for it (no lock where the cache cannot be written, or where the
    lock's name is not a regular file: a FIFO there is not waited on)."""
    try:
        import fcntl

        cache_dir().mkdir(parents=True, exist_ok=True)
        descriptor = os.open(cache_dir() / f"{key}.lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK,
                             0o644)
    except (ImportError, OSError):  # OSError: also a FIFO without a reader (ENXIO)
        yield
        return
    try:
        if stat.S_ISREG(os.fstat(descriptor).st_mode):
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _child_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV and not k.startswith("ACCELERATE_")}
    env.update({IN_CHECK_ENV: "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))})
    return env


def run_check(review: str, properties) -> tuple[Verdict, dict[str, str]]:
    """Run the properties in a fresh process: the verdict, and the digests of the reviewed methods it saw."""
    spec = reviews.REVIEWS.get(review)
    request = json.dumps({"review": review, "properties": [[p.name, p.why, p.target] for p in properties],
                          "registered_by": spec.registered_by if spec is not None else None})
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "trl_rpg.upgrade.verdict"], input=request, capture_output=True,
                              text=True, env=_child_environment(), timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return Verdict(False, error=f"the self-check did not finish in {TIMEOUT_S} s"), {}
    seconds = time.monotonic() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        return Verdict(False, error=f"the self-check's process exited {done.returncode}: {tail}"), {}
    return parse_result(lines[-1][len(RESULT_PREFIX):], properties, seconds)


def parse_result(line: str, properties, seconds: float = 0.0) -> tuple[Verdict, dict[str, str]]:
    """The verdict in the check process's result line, and the digests it saw; "no verdict" (`error`, with the
    reason) for anything but one result per property and a mapping of digests."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError) as error:  # RecursionError: nested too deep
        return Verdict(False, error=f"the self-check's result line is not JSON ({type(error).__name__})"), {}
    if not isinstance(data, dict):
        return Verdict(False, error="the self-check's result line is not a JSON object"), {}
    problem = results_problem(data.get("results"), properties) or _digests_problem(data.get("digests"))
    if problem:
        return Verdict(False, error=f"the self-check's result is malformed: {problem}"), {}
    results = data["results"]
    return Verdict(all(r["passed"] for r in results), results, seconds=seconds), data["digests"]


def verdict(review: str, digests: dict[str, str], fields: list[str]) -> Verdict:
    """The self-check's verdict on the installed TRL for `review` (cached; run when it is not)."""
    properties = upgrade_check.PROPERTIES[review]
    key = cache_key(review, digests, fields, properties)
    cached = read_cached(key, properties, digests)
    if cached is not None:
        return cached
    with _lock(key):
        cached = read_cached(key, properties, digests)  # another process may have run it while this one waited
        if cached is not None:
            return cached
        versions = installed_versions()
        logger.warning("trl-rpg: checking the installed trl %s and transformers %s with the upgrade self-check "
                       "(about a minute; once per installed version)...", versions["trl"], versions["transformers"])
        result, seen = run_check(review, properties)
        if result.error is None and seen != digests:
            changed = sorted(name for name in digests if seen.get(name) != digests[name])
            result = Verdict(False, error=f"the methods {', '.join(changed)} differ between this process and a fresh "
                                          "import of TRL (patched at run time?): the self-check cannot see them")
        if result.error is None:
            result.cached = write_cached(key, result, digests)
        result.fresh = True
    return result


def run_properties(properties, context=None, review: str = "RPGTrainer") -> list[dict]:
    """Each property's result: `{"name", "passed", "detail"}` (an exception is a failure, with where it was
    raised). Without `context`, the trainer checked is the class that `review`'s `Review.trainer` names."""
    results = []
    with tempfile.TemporaryDirectory(prefix="trl-rpg-self-check-") as workdir:
        context = context or upgrade_check.default_context(workdir, reviews.reviewed_class(review))
        context.workdir = workdir
        for prop in properties:
            try:
                detail = prop.function()(context)
            except Exception as error:  # noqa: BLE001 (a property that cannot run on this TRL has failed)
                frame = traceback.extract_tb(error.__traceback__)[-1]
                detail = (f"could not run on this TRL: {type(error).__name__}: {error} (at "
                          f"{Path(frame.filename).name}:{frame.lineno})")
            results.append({"name": prop.name, "passed": detail is None, "detail": detail})
    return results


def main() -> int:
    """The check's own process (`python -m trl_rpg.upgrade.verdict`): reads `{"review", "properties": [[name, why,
    target], ...]}` on stdin, prints the results and the digests of the methods it saw on one line after
    `RESULT_PREFIX`."""
    import importlib

    os.environ[IN_CHECK_ENV] = "1"  # the trainers built here must not ask for a verdict again
    logging.disable(logging.WARNING)
    request = json.loads(sys.stdin.read())
    if request.get("registered_by"):  # a review registered by another module (the asynchronous trainer's)
        importlib.import_module(request["registered_by"])
    properties = [upgrade_check.Property(*item) for item in request["properties"]]
    import torch

    torch.manual_seed(0)
    review = request.get("review", "RPGTrainer")
    results = run_properties(properties, review=review)
    digests = reviews.method_digests(review)
    print(RESULT_PREFIX + json.dumps({"results": results, "digests": digests}), flush=True)
    return 0


__all__ = ["IN_CHECK_ENV", "RESULT_PREFIX", "TIMEOUT_S", "Verdict", "cache_dir", "cache_key", "installed_versions",
           "main", "parse_result", "read_cached", "results_problem", "run_check", "run_properties", "verdict",
           "write_cached"]

if __name__ == "__main__":
    sys.exit(main())
