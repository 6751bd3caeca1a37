"""ServerArgs: the runtime subset of SGLang's server flags, with SGLang's names and defaults.

SGLang's ``ServerArgs`` (``sglang/srt/server_args.py``) carries hundreds of options for the HTTP server,
scheduling, caching, parallelism and kernels. minisgl keeps the ones its runtime honours and refuses, by
name, the SGLang flags a learner might pass that it does not implement, rather than silently ignoring them.
"""

from __future__ import annotations

import argparse
import dataclasses

from minisgl.utils.common import InputError

# SGLang flags a user may bring over from an SGLang command line; minisgl refuses each one by name.
UNSUPPORTED_SGLANG_FLAGS = (
    "--kv-cache-dtype", "--quantization", "--cuda-graph-bs", "--trust-remote-code", "--context-length",
    "--chunked-prefill-size",
    "--max-running-requests", "--enable-dp-attention", "--dp-size", "--ep-size", "--nnodes",
    "--node-rank", "--dist-init-addr", "--sampling-backend", "--disable-radix-cache",
    "--prefill-attention-backend", "--decode-attention-backend", "--tokenizer-mode", "--pp-size",
)  # fmt: skip

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
DTYPES = ("auto", "float32", "float", "bfloat16", "float16", "half")
ATTENTION_BACKENDS = ("torch_native",)


class _Refuse(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is an SGLang flag that minisgl does not implement; remove it")


@dataclasses.dataclass
class ServerArgs:
    model_path: str | None = None
    tokenizer_path: str | None = None
    load_format: str = "auto"
    dtype: str = "auto"
    device: str = "cpu"
    tp_size: int = 1
    mem_fraction_static: float | None = None
    max_total_tokens: int | None = None
    page_size: int = 1
    attention_backend: str = "torch_native"
    random_seed: int = 42
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int = 32
    log_level: str = "info"

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add = parser.add_argument
        add(
            "--model-path",
            "--model",
            type=str,
            default=None,
            help="HF directory (config.json + safetensors) or a .gguf file; default: SmolLM2-135M-Instruct GGUF",
        )
        add("--tokenizer-path", type=str, default=None, help="tokenizer directory; default: the model path")
        add(
            "--load-format",
            type=str,
            default="auto",
            choices=LOAD_FORMATS,
            help="weights format; dummy = random weights from the config (no checkpoint needed)",
        )
        add(
            "--dtype",
            type=str,
            default="auto",
            choices=DTYPES,
            help="weights and activations dtype; auto = float32 on CPU, the checkpoint's half type on CUDA",
        )
        add("--device", type=str, default="cpu", help="cpu, cuda or cuda:N")
        add("--tp-size", "--tensor-parallel-size", type=int, default=1, help="tensor-parallel ranks")
        add(
            "--mem-fraction-static",
            type=float,
            default=None,
            help="fraction of free memory for the KV pool (default 0.85 on CUDA, 0.1 of RAM on CPU)",
        )
        add("--max-total-tokens", type=int, default=None, help="KV pool capacity in tokens (overrides the budget)")
        add("--page-size", type=int, default=1, help="tokens per KV page; minisgl supports 1")
        add(
            "--attention-backend",
            type=str,
            default="torch_native",
            choices=ATTENTION_BACKENDS,
            help="attention kernels reading K/V through req_to_token",
        )
        add("--random-seed", type=int, default=42, help="seed for dummy weights, synthetic inputs and sampling")
        add(
            "--enable-torch-compile",
            action="store_true",
            help="compile the model forward with torch.compile (the first batch of each mode compiles)",
        )
        add("--torch-compile-max-bs", type=int, default=32, help="largest decode batch run compiled")
        add("--disable-cuda-graph", action="store_true", help="on CUDA, run every decode eagerly (no graph replay)")
        add(
            "--cuda-graph-max-bs",
            type=int,
            default=32,
            help="largest decode batch replayed from a CUDA graph (bench_one_batch: the largest --batch-size)",
        )
        add("--log-level", type=str, default="info", help="python logging level")
        for flag in UNSUPPORTED_SGLANG_FLAGS:
            add(flag, action=_Refuse, nargs="?", help=argparse.SUPPRESS)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    def check(self) -> None:
        """Refuse values minisgl cannot run with, before anything is loaded."""
        if self.tp_size < 1:
            raise InputError(f"--tp-size must be at least 1, got {self.tp_size}")
        if self.page_size != 1:
            raise InputError(f"--page-size {self.page_size}: minisgl's allocator is token-granular; use 1")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise InputError(f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}")
        if self.torch_compile_max_bs < 1:
            raise InputError(f"--torch-compile-max-bs must be at least 1, got {self.torch_compile_max_bs}")
        if self.cuda_graph_max_bs < 1:
            raise InputError(f"--cuda-graph-max-bs must be at least 1, got {self.cuda_graph_max_bs}")
        if self.max_total_tokens is not None and self.max_total_tokens < 1:
            raise InputError(f"--max-total-tokens must be positive, got {self.max_total_tokens}")
