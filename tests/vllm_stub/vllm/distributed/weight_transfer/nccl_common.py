"""Stub: imported by `trl.generation.vllm_client` (vLLM >= 0.28); the fake engine needs no NCCL group."""


def trainer_init(init_info):
    raise NotImplementedError("fake vLLM: no NCCL weight transfer; tests replace TRL's VLLMClient with a fake one")
