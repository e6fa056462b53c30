"""`SamplingParams` and `StructuredOutputsParams` of the fake vLLM (the fields TRL and trl-rpg pass).

Validation follows vLLM's: `temperature >= 0`, `0 < top_p <= 1`, `top_k` 0 or -1 (off) or >= 1, `0 <= min_p <= 1`,
`n >= 1`, `max_tokens >= 1`; an unknown keyword is a `TypeError`, as with vLLM's own struct. Settings the fake engine
does not implement (a repetition penalty, presence/frequency penalties, structured outputs) are refused when
generating, naming the field, rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StructuredOutputsParams:
    regex: str | None = None
    json: object | None = None
    choice: list | None = None
    grammar: str | None = None


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int | None = 16
    logprobs: int | None = None
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self):
        if self.min_p is None:
            self.min_p = 0.0
        checks = {
            "n": self.n >= 1, "temperature": self.temperature >= 0, "top_p": 0 < self.top_p <= 1,
            "top_k": self.top_k in (-1, 0) or self.top_k >= 1, "min_p": 0 <= self.min_p <= 1,
            "max_tokens": self.max_tokens is None or self.max_tokens >= 1,
            "logprobs": self.logprobs is None or self.logprobs >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"SamplingParams: invalid {bad[0]}={getattr(self, bad[0])!r}.")

    def unsupported(self) -> list[str]:
        """The settings given here that the fake engine does not implement."""
        return [name for name, value, off in (
            ("repetition_penalty", self.repetition_penalty, 1.0), ("presence_penalty", self.presence_penalty, 0.0),
            ("frequency_penalty", self.frequency_penalty, 0.0), ("structured_outputs", self.structured_outputs, None),
        ) if value != off]
