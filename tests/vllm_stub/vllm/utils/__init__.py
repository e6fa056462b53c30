"""Stub of `vllm.utils`: only the names TRL imports when vLLM is installed (see vllm/__init__.py)."""
