"""Stub of `vllm.distributed`: only the weight-transfer names TRL imports (see vllm/__init__.py)."""
