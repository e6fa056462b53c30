"""Stub of `vllm.distributed.weight_transfer`."""
