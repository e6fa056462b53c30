"""`python -m trl_rpg.cli ...`: the `trl-rpg` command (`python -m trl_rpg` trains in this process instead)."""

import sys

from .entry import main

sys.exit(main())
