"""Stub of `vllm.utils.network_utils` (imported by `trl.generation.vllm_client`, used only by its real client)."""


def get_ip() -> str:
    return "127.0.0.1"
