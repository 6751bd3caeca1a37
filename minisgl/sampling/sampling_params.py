"""SamplingParams: per-request decoding settings, normalised as SGLang normalises them.

Temperature 0 means greedy, rewritten to ``top_k=1, temperature=1`` so a batch of greedy requests takes
the argmax fast path; ``top_k=-1`` means the whole vocabulary. SGLang's version adds stop strings and
regexes, stop tokens, penalties, JSON/EBNF constraints, logit bias, ``n``, custom parameters and
``verify``; the bench never stops a request early, so minisgl keeps only what sampling reads.
"""

from __future__ import annotations

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
    ):
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        if 0 <= self.temperature < _SAMPLING_EPS:
            self.temperature, self.top_k = 1.0, 1
        if self.top_k == -1:
            self.top_k = TOP_K_ALL
