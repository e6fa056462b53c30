"""What `AsyncRPGTrainer` needs to run, checked before anything loads: TRL's asynchronous trainer generates with a
vLLM server and trains with the FA3 varlen kernel and CUDA's device properties, so on a machine without a CUDA GPU
it failed after the model had loaded with TRL's raw `AssertionError: Torch not compiled with CUDA enabled`. Without
CUDA it runs only with an injected rollout worker inside `trl_rpg.toy.async_trainer_on_cpu` (the CPU stand-ins the
tests, the benchmark and `trl-rpg demo --async` use); anything else is refused in one line saying so."""

from __future__ import annotations

#: The `AsyncGRPOTrainer.__init__` parameter after `model, reward_funcs, args` that `rollout_worker` is (TRL 1.16).
_ROLLOUT_WORKER_POSITION = 7


class AsyncRuntimeMissing(RuntimeError):
    """`AsyncRPGTrainer` was built where it cannot run: no CUDA GPU, and no CPU stand-ins in place of the server."""


def rollout_worker_argument(positional: tuple, kwargs: dict):
    """The `rollout_worker` an `AsyncRPGTrainer(model, reward_funcs, args, *positional, **kwargs)` call passes."""
    if "rollout_worker" in kwargs:
        return kwargs["rollout_worker"]
    return positional[_ROLLOUT_WORKER_POSITION] if len(positional) > _ROLLOUT_WORKER_POSITION else None


def missing_runtime(cuda: bool, rollout_worker, cpu_stand_ins: bool) -> str | None:
    """Why the asynchronous trainer cannot run here (one line), or None: without `cuda` it needs an injected
    `rollout_worker` and the CPU stand-ins in place (`cpu_stand_ins`: within `async_trainer_on_cpu`)."""
    if cuda:
        return None
    demo = "To see it train on CPU, with stand-ins for the server: `trl-rpg demo --async` (docs/asynchronous.md)."
    if rollout_worker is None:
        return ("AsyncRPGTrainer needs a CUDA GPU and a vLLM server (`trl vllm-serve`), as TRL's asynchronous trainer "
                "does, or an injected rollout worker (`rollout_worker=`, `weight_transfer=`); this machine has no "
                f"CUDA GPU. {demo}")
    if not cpu_stand_ins:
        return ("AsyncRPGTrainer without a CUDA GPU: an injected rollout worker also needs the CPU stand-in of the "
                "FA3 varlen kernel; build and train the trainer inside `with trl_rpg.toy.async_trainer_on_cpu("
                f"trl_rpg.toy.VarlenAttention):`. {demo}")
    return None


def check_async_runtime(positional: tuple, kwargs: dict) -> None:
    """Raise `AsyncRuntimeMissing` (one line, naming what is needed and the demo) where `AsyncRPGTrainer(model,
    reward_funcs, args, *positional, **kwargs)` cannot run: called first in its constructor, before any load."""
    import torch

    from .. import _compat

    reason = missing_runtime(torch.cuda.is_available(), rollout_worker_argument(positional, kwargs),
                             _compat.async_cpu_stand_ins_installed())
    if reason:
        raise AsyncRuntimeMissing(reason)


__all__ = ["AsyncRuntimeMissing", "check_async_runtime", "missing_runtime", "rollout_worker_argument"]
