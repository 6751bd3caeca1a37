"""Qwen2: the Llama decoder with a bias on the q/k/v projections (and none on o_proj).

SGLang's ``qwen2.py`` is a separate copy of the Llama stack; here the difference is one override.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from minisgl.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def qkv_bias(config: PretrainedConfig) -> bool:
        return True


EntryClass = [Qwen2ForCausalLM]
