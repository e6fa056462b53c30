"""`python -m trl_rpg train ...` trains in this process, which is what `accelerate launch [...] -m trl_rpg train ...`
runs on every process; `python -m trl_rpg demo` runs the CPU demo. `trl-rpg train` launches this module through
`accelerate launch` (with `PYTHONSAFEPATH=1`).

`python -m` puts the working directory first on `sys.path`, so a `peft.py` or `trl.py` there would be imported in
place of the dependency. Unless Python already left it out (`-P`, `PYTHONSAFEPATH`), it is taken off here, before
TRL and its dependencies are imported; `--reward_funcs my_module.my_reward` still finds `my_module.py` there (the
CLI searches the working directory after the installed packages).
"""

import os
import sys

if not getattr(sys.flags, "safe_path", False) and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .cli import main  # noqa: E402  (after sys.path is made safe: importing the CLI imports TRL)

if __name__ == "__main__":
    sys.exit(main(launch=False, prog="python -m trl_rpg"))
