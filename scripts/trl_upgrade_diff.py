"""What a maintainer reviews when TRL releases a new version: the methods RPG relies on that changed, with their
diffs, and the GRPOConfig fields to classify.

    pip install --no-deps --target /tmp/trl-new "trl==1.17.0"     # the new release, beside the reviewed one
    python scripts/trl_upgrade_diff.py /tmp/trl-new

The reviewed side is the TRL installed in this environment (`pip install -e ".[test]" -c constraints.txt` installs
the reviewed versions); the new side is read in a fresh process with the given folder first on `sys.path`. For
every review (`trl_rpg.upgrade.guard.REVIEWS`: RPGTrainer's and AsyncRPGTrainer's, `trl_rpg.upgrade.async_guard`)
it prints each changed method's unified diff (a method whose normalised source is unchanged is not listed), the new
digest to record once reviewed (`trl_rpg/upgrade/guard.py`, `trl_rpg/upgrade/async_guard.py`), and the config fields
added (to classify in `trl_rpg/upgrade/grpo_fields.py` or `trl_rpg/upgrade/async_fields.py`: accepted, changed
default, refused or
ignored, with the reason) or removed. Then run `tests/test_upgrade_guard.py`
and the self-check (`python -c "from trl_rpg.upgrade import guard as upgrade_guard; print(upgrade_guard.status())"`
with the new
TRL installed). Exit status 0 (1 when the new side cannot be read).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


#: Per review: where its reviewed digests are recorded, and where its config fields are classified.
FILES = {"RPGTrainer": {"digests": "trl_rpg/upgrade/guard.py", "fields": "trl_rpg/upgrade/grpo_fields.py"},
         "AsyncRPGTrainer": {"digests": "trl_rpg/upgrade/async_guard.py",
                             "fields": "trl_rpg/upgrade/async_fields.py (ASYNC_FIELDS)"}}


def _field_default(f) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    return "(a factory)" if f.default_factory is not dataclasses.MISSING else "(required)"


def dump() -> dict:
    """What this process's TRL holds of what RPG reviewed: each method's source and digest, each config's fields."""
    from importlib.metadata import version

    from trl_rpg.upgrade import guard as upgrade_guard
    try:
        from trl_rpg.upgrade import async_guard as async_upgrade_guard
    except ImportError:  # a TRL without the asynchronous trainer: RPGTrainer's review only
        pass
    else:
        async_upgrade_guard.register()  # AsyncRPGTrainer's review, as the module lists it
    owners = upgrade_guard._owners()
    reviews = {}
    for name, review in upgrade_guard.REVIEWS.items():
        methods = {}
        for method in review.methods:
            func = getattr(owners.get(method.owner), method.name, None)
            source = textwrap.dedent(inspect.getsource(inspect.unwrap(func))) if func is not None else None
            methods[method.qualname] = {"source": source, "digest": upgrade_guard.source_digest(func) if func
                                        else "missing", "reviewed": method.digest}
        config = owners.get(review.config)
        fields = {f.name: {"default": _field_default(f), "help": f.metadata.get("help", "")}
                  for f in (dataclasses.fields(config) if config is not None else [])}
        reviews[name] = {"methods": methods, "fields": fields, "classified": sorted(review.fields),
                         "files": FILES.get(name, FILES["RPGTrainer"])}
    return {"versions": {name: version(name) for name in ("trl", "transformers")}, "reviews": reviews}


def dump_from(site: str) -> dict:
    """`dump()` in a fresh process whose `sys.path` starts with `site`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, __file__, "--dump"], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"could not read the TRL in {site}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.splitlines()[-1])


def compare(reviewed: dict, new: dict) -> str:
    """The report: per review, the changed methods with diffs and new digests, then the config fields."""
    from trl_rpg.upgrade.guard import REVIEWED_VERSIONS

    old_v, new_v = reviewed["versions"], new["versions"]
    pinned = ", ".join(f"{name} {v}" for name, v in REVIEWED_VERSIONS.items())
    installed = ", ".join(f"{name} {old_v[name]}" for name in REVIEWED_VERSIONS)
    side = ("reviewed" if installed == pinned else f"installed (NOT the reviewed {pinned}: the diffs are against it; "
            "install with -c constraints.txt for the reviewed side)")
    out = [f"{side}: {installed}; new: trl {new_v['trl']}, transformers {new_v['transformers']}"]
    for name, new_review in new["reviews"].items():
        old_review = reviewed["reviews"].get(name, {"methods": {}, "fields": {}})
        changed = [q for q, m in new_review["methods"].items() if m["digest"] != m["reviewed"]]
        files = new_review.get("files", FILES.get(name, FILES["RPGTrainer"]))
        out.append(f"\n## {name}: {len(changed)} of {len(new_review['methods'])} reviewed methods changed"
                   + (f" (record the new digests in {files['digests']})" if changed else ""))
        for qualname in changed:
            method, before = new_review["methods"][qualname], old_review["methods"].get(qualname, {})
            out.append(f"\n### {qualname}: digest {method['reviewed']} -> {method['digest']}")
            if method["source"] is None:
                out.append("(no longer exists)")
                continue
            out.extend(difflib.unified_diff((before.get("source") or "").splitlines(), method["source"].splitlines(),
                                            f"trl {old_v['trl']}", f"trl {new_v['trl']}", lineterm=""))
        added = [f for f in new_review["fields"] if f not in new_review.get("classified", [])]
        removed = [f for f in old_review["fields"] if f not in new_review["fields"]]
        out.append(f"\n### config fields to classify ({len(added)}): {files['fields']}")
        out += [f"- {f} = {new_review['fields'][f]['default']}: {new_review['fields'][f]['help']}" for f in added]
        if removed:
            out.append(f"### config fields removed ({len(removed)}): drop their rows: {', '.join(removed)}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", nargs="?", help="the folder the new TRL is installed in (pip install --target)")
    parser.add_argument("--dump", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump:
        print(json.dumps(dump()))
        return 0
    if not args.site:
        parser.error("give the folder the new TRL is installed in (pip install --no-deps --target DIR trl==X)")
    try:
        new = dump_from(args.site)
    except RuntimeError as error:
        print(f"trl_upgrade_diff: error: {error}", file=sys.stderr)
        return 1
    print(compare(dump(), new))
    return 0


if __name__ == "__main__":
    sys.exit(main())
