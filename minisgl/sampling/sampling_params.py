"""SamplingParams: per-request decoding settings, normalised as SGLang normalises them.

Temperature 0 means greedy, rewritten to ``top_k=1, temperature=1`` so a batch of greedy requests takes
the argmax fast path; ``top_k=-1`` means the whole vocabulary. SGLang's version adds stop strings and
regexes, penalties, JSON/EBNF constraints, logit bias, ``n`` and custom parameters.
"""

from __future__ import annotations

from minisgl.utils.common import InputError

_SAMPLING_EPS = 1e-6
TOP_K_ALL = 1 << 30


class SamplingParams:
    def __init__(
        self,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        stop_token_ids: list[int] | None = None,
        ignore_eos: bool = False,
    ):
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.stop_token_ids = set(stop_token_ids or ())
        self.ignore_eos = ignore_eos
        if 0 <= self.temperature < _SAMPLING_EPS:
            self.temperature, self.top_k = 1.0, 1
        if self.top_k == -1:
            self.top_k = TOP_K_ALL

    def verify(self) -> None:
        if self.temperature < 0:
            raise InputError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 1:
            raise InputError(f"top_k must be -1 (all) or at least 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise InputError(f"min_p must be in [0, 1], got {self.min_p}")
