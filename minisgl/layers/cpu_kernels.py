"""minisgl's C++ CPU kernels, built from ``csrc`` sources into one extension at first use.

The kernels there: decode attention over the paged pool (``attention/csrc/decode.cpp``, called through
``attention/cpu_decode.py``), causal prefill attention (``attention/csrc/prefill.cpp``, through
``attention/cpu_prefill.py``), the linear product for a decode step's few rows (``csrc/gemm.cpp``, called through
``amx_utils.py``), and the eager forward's elementwise layers, each one pass over its rows where aten launches
several kernels: RMSNorm with the residual add (``csrc/norm.cpp``), SiluAndMul (``csrc/activation.cpp``) and RoPE
(``csrc/rope.cpp``). The build (``torch.utils.cpp_extension`` with ninja, ~15 s, cached under
``~/.cache/torch_extensions`` until a source or torch changes) uses the vector ISA TorchInductor picks for this CPU
(ATen's scalar ``Vectorized`` where it picks none). Where no C++ compiler works, one line on stderr says so and
each caller keeps its aten path (gather + SDPA; oneDNN, MKL or ``F.linear``).

SGLang's counterpart is the ``sgl_kernel`` package, whose CPU build (``sgl-kernel/setup_cpu.py``) ships the same
kinds of kernels prebuilt in a wheel, with AVX-512 and AMX paths.
"""

from __future__ import annotations

import functools
import os
import re
import sys

import torch

HERE = os.path.dirname(__file__)
SOURCES = [os.path.join(HERE, "attention", "csrc", name) for name in ("decode.cpp", "prefill.cpp")] + [
    os.path.join(HERE, "csrc", name) for name in ("gemm.cpp", "norm.cpp", "activation.cpp", "rope.cpp")
]


@functools.cache
def cpu_kernels_built() -> bool:
    """Build (or load the cached build of) the kernels once per process, registering ``torch.ops.minisgl_cpu``;
    False where they cannot be built."""
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa
        from torch.utils import cpp_extension

        isa = pick_vec_isa()  # probes the compiler; falsy where no vector ISA builds (ATen's scalar Vectorized then)
        # No contraction of a multiply and an add into one FMA: the elementwise kernels round each product where
        # HF does (the GEMM and attention kernels ask for their FMAs explicitly).
        flags = ["-O3", "-fopenmp", "-ffp-contract=off"]
        if isa:
            flags += [f"-D{macro}" for macro in isa.build_macro()] + isa.build_arch_flags().split()
        cpp_extension.load(
            name="minisgl_cpu_" + re.sub(r"\W", "_", str(isa) if isa else "scalar"),  # "avx512 avx512_vnni"
            sources=SOURCES,
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
        )
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, a failed build: each leaves the aten paths
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(
            f"minisgl: CPU kernels not built ({first_line}); attention uses SDPA (or tiles), linears oneDNN/MKL, "
            "norms, activation and RoPE aten's ops",
            file=sys.stderr,
        )
        return False
    return True


# The dtypes every kernel here takes; float16 stays on aten (and SDPA, oneDNN) everywhere.
KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def uses_cpu_kernels(x: torch.Tensor) -> bool:
    """Whether an eager layer on ``x`` runs its C++ elementwise kernel (norm, activation, RoPE): on CPU, in float32
    or bfloat16 (float16 keeps aten's ops), where they are built. Traced, the layers keep aten's ops, which the
    compiler fuses into its own loops."""
    return (
        x.device.type == "cpu"
        and x.dtype in KERNEL_DTYPES
        and not torch.compiler.is_compiling()
        and cpu_kernels_built()
    )
