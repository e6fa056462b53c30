import os
import sys

# Tiny models run fastest single-threaded (measured: thread start-up dominates their small matmuls); launched
# subprocesses (accelerate, torchrun) inherit the setting through the environment.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)

sys.path.insert(0, os.path.dirname(__file__))  # test helpers such as _enumeration.py and _tiny.py
