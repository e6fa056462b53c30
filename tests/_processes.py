"""How a script that several processes run ends (torch only: a launched script imports it cheaply)."""

import torch.distributed as dist


def end_processes() -> None:
    """End a script that several processes run, after it succeeded: wait for every process, then destroy the process
    group, as TRL's `grpo.py` does through `trainer.end()`. A gloo group left to the interpreter's exit can abort the
    process after all its work is done ("terminate called without an active exception", SIGABRT: its worker threads
    are destroyed unjoined; pytorch/pytorch#65513, #190489), which fails the launch of a run that passed."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def free_port() -> int:
    """A TCP port free on this machine now, for a launch's `--master_port` / `--main_process_port`."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
