"""`python -m trl_rpg train ...` trains in this process, which is what `accelerate launch [...] -m trl_rpg train ...`
runs on every process; `python -m trl_rpg demo` runs the CPU demo. `trl-rpg train` launches this module through
`accelerate launch`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(launch=False, prog="python -m trl_rpg"))
