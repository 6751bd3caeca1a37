"""RMSNorm, SiluAndMul and RoPE against transformers' own modules, including their in-place contracts, on both eager
CPU paths (the C++ kernels and aten's ops); then the linear layers' kernels against ``F.linear``.

RMSNorm(x, residual) must return HF's ``LlamaRMSNorm(x + residual)`` and leave the sum in ``residual`` (as SGLang's
``fused_add_rmsnorm`` does); SiluAndMul must equal HF's ``silu(gate) * up`` and RoPE HF's ``apply_rotary_pos_emb``,
bit for bit in both dtypes (compiled SiluAndMul, float32 within an ulp; the RMSNorm kernel within its sum's rounding,
aten's RoPE within its addcmul's).
"""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from minisgl.layers import activation, amx_utils, layernorm, linear, rotary_embedding
from minisgl.layers.activation import SiluAndMul
from minisgl.layers.cpu_kernels import cpu_kernels_built
from minisgl.layers.layernorm import RMSNorm
from minisgl.layers.rotary_embedding import get_rope
from minisgl.model_executor.cpu_graph_runner import set_torch_compile_config


@pytest.fixture(params=["kernel", "aten"])
def elementwise_path(request, monkeypatch):
    """The two eager CPU paths of RMSNorm, SiluAndMul and RoPE: minisgl's C++ kernels, and aten's ops (the path of
    traced graphs, of CUDA, and of CPUs where the kernels cannot be built)."""
    if request.param == "kernel":
        assert cpu_kernels_built()
    else:
        for module in (layernorm, activation, rotary_embedding):
            monkeypatch.setattr(module, "uses_cpu_kernels", lambda x: False)
    return request.param


def assert_matches_hf_rmsnorm(out, expected, path):
    """aten's ops are HF's, bit for bit. The kernel adds the squares in another order, so float32 moves by an ulp or
    two (of the mean square, then of each output); bfloat16 by one of its own ulps where that crosses a rounding."""
    if path == "aten":
        assert torch.equal(out, expected)
    elif out.dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=3 * 2**-23, atol=1e-30)
    else:
        torch.testing.assert_close(out, expected, rtol=2**-8, atol=1e-30)


@pytest.mark.parametrize("rows", [1, 7, 300], ids=["1-row", "7-rows", "300-rows-threaded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_hf_and_updates_residual_in_place(elementwise_path, dtype, rows):
    torch.manual_seed(rows)
    hidden = 576
    ours, hf = RMSNorm(hidden, eps=1e-5).to(dtype), LlamaRMSNorm(hidden, eps=1e-5).to(dtype)
    weight = torch.randn(hidden, dtype=dtype)
    ours.weight.data.copy_(weight)
    hf.weight.data.copy_(weight)
    x, residual = torch.randn(rows, hidden, dtype=dtype) * 3, torch.randn(rows, hidden, dtype=dtype)

    assert_matches_hf_rmsnorm(ours(x), hf(x), elementwise_path)

    expected_sum = x + residual
    x_before = x.clone()
    out, new_residual = ours(x, residual)
    assert new_residual is residual and torch.equal(residual, expected_sum)
    assert torch.equal(x, x_before)  # the layer output passed in is read, not written
    assert_matches_hf_rmsnorm(out, hf(expected_sum), elementwise_path)


def test_rmsnorm_kernel_normalizes_strided_heads():
    """Qwen3's per-head norm gets views of the qkv output ([tokens, heads, head_dim], rows strided): the kernel
    normalizes each head's row as HF does on the same values made contiguous."""
    torch.manual_seed(0)
    qkv = torch.randn(5, 3 * 4 * 32)
    heads = qkv[:, 32:160].view(5, 4, 32)
    ours, hf = RMSNorm(32, eps=1e-6), LlamaRMSNorm(32, eps=1e-6)
    assert_matches_hf_rmsnorm(ours(heads), hf(heads.contiguous()), "kernel")


@pytest.mark.parametrize("rows", [1, 5, 300], ids=["1-row", "5-rows", "300-rows-threaded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_matches_hf(elementwise_path, dtype, rows):
    """Both paths are HF's ``silu(gate) * up`` bit for bit: the kernel computes silu with aten's formula on the same
    vector exp (and aten's scalar one for a row's tail: 200 is no multiple of a vector) and rounds where HF rounds."""
    torch.manual_seed(0)
    gate_up = torch.randn(rows, 2 * 200, dtype=dtype) * 4
    gate, up = gate_up.clone().chunk(2, dim=-1)
    assert torch.equal(SiluAndMul()(gate_up), ACT2FN["silu"](gate) * up)


@pytest.mark.parametrize("tokens", [37, 300], ids=["37-tokens", "300-tokens-threaded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_matches_hf_in_place_on_qkv_views(elementwise_path, dtype, tokens):
    """RoPE on q and k as the attention layer passes them, views into the qkv output, against HF's own rotary
    embedding and ``apply_rotary_pos_emb`` on copies, llama3 scaling included: the kernel rounds each product where
    HF does, so it is equal bit for bit, and rotates the views in place; aten's path is within its rounding. 300
    tokens are past the kernel's grain, so two threads split them."""
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 64})  # fmt: skip
    torch.manual_seed(0)
    head_dim = 64
    positions = torch.randint(0, 512, (tokens,))
    qkv = torch.randn(tokens, (4 + 2 + 2) * head_dim, dtype=dtype)
    q, k, _ = qkv.split([4 * head_dim, 2 * head_dim, 2 * head_dim], dim=-1)
    q, k = q.reshape(tokens, 4, head_dim), k.reshape(tokens, 2, head_dim)
    hf_q, hf_k = q.transpose(0, 1)[None].clone(), k.transpose(0, 1)[None].clone()  # HF's [batch, heads, tokens, dim]
    cos, sin = LlamaRotaryEmbedding(config)(hf_q, positions[None])
    hf_q, hf_k = apply_rotary_pos_emb(hf_q, hf_k, cos.to(dtype), sin.to(dtype))

    out_q, out_k = get_rope(config, head_dim, 512)(positions, q, k)
    expected_q, expected_k = hf_q[0].transpose(0, 1), hf_k[0].transpose(0, 1)
    if elementwise_path == "kernel":
        assert torch.equal(out_q, expected_q) and torch.equal(out_k, expected_k)
        assert out_q.data_ptr() == q.data_ptr() and torch.equal(qkv[:, : 4 * head_dim].view(tokens, 4, -1), out_q)
    else:  # addcmul rounds the sum and the second product once
        tolerance = {"rtol": 2**-22, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 1e-2}
        torch.testing.assert_close(out_q, expected_q, **tolerance)
        torch.testing.assert_close(out_k, expected_k, **tolerance)


def test_float16_layers_keep_atens_ops_and_match_hf():
    """The C++ kernels take float32 and bfloat16 only: a float16 model on CPU (``--dtype float16``) keeps aten's
    ops in RMSNorm, SiluAndMul and RoPE, which are HF's own, bit for bit."""
    assert cpu_kernels_built()
    torch.manual_seed(0)
    x, residual = torch.randn(3, 64, dtype=torch.float16), torch.randn(3, 64, dtype=torch.float16)
    norm, hf_norm = RMSNorm(64).half(), LlamaRMSNorm(64).half()
    assert torch.equal(norm(x), hf_norm(x))
    out, _ = norm(x, residual.clone())
    assert torch.equal(out, hf_norm(x + residual))
    gate_up = torch.randn(3, 2 * 40, dtype=torch.float16)
    gate, up = gate_up.clone().chunk(2, dim=-1)
    assert torch.equal(SiluAndMul()(gate_up), ACT2FN["silu"](gate) * up)
    config = LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=64)
    positions, q, k = torch.arange(3), torch.randn(3, 2, 64, dtype=torch.float16), torch.randn(3, 2, 64).half()
    hf_q, hf_k = q.transpose(0, 1)[None].clone(), k.transpose(0, 1)[None].clone()
    cos, sin = LlamaRotaryEmbedding(config)(hf_q, positions[None])
    hf_q, hf_k = apply_rotary_pos_emb(hf_q, hf_k, cos.half(), sin.half())
    out_q, out_k = get_rope(config, 64, 64)(positions, q, k)
    torch.testing.assert_close(out_q, hf_q[0].transpose(0, 1), rtol=2**-10, atol=1e-3)
    torch.testing.assert_close(out_k, hf_k[0].transpose(0, 1), rtol=2**-10, atol=1e-3)


def test_rope_kernel_refuses_a_position_outside_its_table():
    rope = get_rope(LlamaConfig(hidden_size=64, num_attention_heads=1, max_position_embeddings=16), 64, 16)
    q = k = torch.zeros(1, 1, 64)
    with pytest.raises(RuntimeError, match="position 16 is outside the 16-position table"):
        rope(torch.tensor([16]), q, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_silu_and_mul_matches_hf(dtype):
    """Traced, SiluAndMul takes its out-of-place branch: bfloat16 still rounds as HF does, bit for bit; float32
    differs from ATen's exp by an ulp at most."""
    set_torch_compile_config()
    torch.manual_seed(0)
    gate_up = torch.randn(37, 2 * 200, dtype=dtype) * 4
    gate, up = gate_up.clone().chunk(2, dim=-1)
    out = torch.compile(SiluAndMul())(gate_up)
    expected = ACT2FN["silu"](gate) * up
    if dtype == torch.bfloat16:
        assert torch.equal(out, expected)
    else:
        torch.testing.assert_close(out, expected, rtol=2e-7, atol=2e-7)


@pytest.mark.parametrize("padded_rows", [1, 4], ids=["unpadded", "padded-to-4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_linear_on_prepacked_weight_matches_plain_linear(monkeypatch, padded_rows, dtype):
    """Both answers of min_packed_rows (4 or 1), every row count around it: the packed kernel, padded or not,
    returns exactly the input's rows with the plain layer's values."""
    monkeypatch.setattr(amx_utils, "min_packed_rows", lambda: padded_rows)
    weight, bias = torch.randn(48, 40).to(dtype), torch.randn(48).to(dtype)
    packed = amx_utils.prepack_weight(weight)
    for rows in range(1, 6):
        x = torch.randn(rows, 40).to(dtype)
        out = amx_utils.apply_linear(x, packed, bias)
        ref = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
        assert out.shape == (rows, 48) and out.dtype == dtype
        torch.testing.assert_close(out.double(), ref, atol=1e-4 if dtype == torch.float32 else 0.1, rtol=0.02)


def test_float32_copy_serves_bfloat16_batches_only(monkeypatch):
    """A plain bfloat16 weight (one oneDNN could not pack) gets a float32 copy that inputs of two or more rows
    read; a single row reads the bfloat16 weight, as torch's own linear does. The copy's outputs are bfloat16,
    the float32 product of the exact bfloat16 values rounded once: within half a bfloat16 step of the float64
    product (plus float32 sum-order noise). Doubling the copy doubles the outputs of batches alone."""
    monkeypatch.setattr(amx_utils, "CPU_MULTIPLIES_BFLOAT16", False)  # an AVX2-only CPU, whatever this one is
    weight, bias = torch.randn(48, 40).bfloat16(), torch.randn(48).bfloat16()
    amx_utils.keep_float32_copy(weight)
    assert weight.float32_weight.dtype == torch.float32
    for rows in (1, 2, 5):
        for b in (None, bias):
            x = torch.randn(rows, 40).bfloat16()
            out = amx_utils.apply_linear(x, weight, b)
            assert out.shape == (rows, 48) and out.dtype == torch.bfloat16
            if rows == 1:
                assert torch.equal(out, torch.nn.functional.linear(x, weight, b))
                continue
            ref = torch.nn.functional.linear(x.double(), weight.double(), None if b is None else b.double())
            assert ((out.double() - ref).abs() <= ref.abs() * 2**-8 + 1e-5).all()
    if weight.float32_weight.is_mkldnn:
        weight.float32_weight = amx_utils.prepack_weight(weight.double().float() * 2)
    else:
        weight.float32_weight.mul_(2)
    x = torch.randn(3, 40).bfloat16()
    assert torch.equal(amx_utils.apply_linear(x[:1], weight), torch.nn.functional.linear(x[:1], weight))
    doubled = torch.nn.functional.linear(x.double(), 2 * weight.double())
    torch.testing.assert_close(amx_utils.apply_linear(x, weight).double(), doubled, atol=1e-5, rtol=2**-8)


@pytest.mark.parametrize("multiplies_bfloat16", [False, True], ids=["avx2-only", "bfloat16-arithmetic"])
def test_float32_copies_only_for_bfloat16_cpu_weights_without_bfloat16_arithmetic(monkeypatch, multiplies_bfloat16):
    """Only CPU bfloat16 weights get a copy, and only where the CPU cannot multiply bfloat16 (where it can, oneDNN
    packs them instead); float32 and GPU (here meta) weights never do. Without a copy (a compiled model's plain
    weights), batched rows convert the weight on the fly: the same values."""
    monkeypatch.setattr(amx_utils, "CPU_MULTIPLIES_BFLOAT16", multiplies_bfloat16)
    float32, meta = torch.randn(8, 8), torch.randn(8, 8, device="meta").bfloat16()
    bfloat16 = torch.randn(8, 8).bfloat16()
    for weight in (float32, amx_utils.prepack_weight(float32), meta, bfloat16):
        amx_utils.keep_float32_copy(weight)
    assert not any(hasattr(w, "float32_weight") for w in (float32, meta))
    assert hasattr(bfloat16, "float32_weight") == (not multiplies_bfloat16)
    if not multiplies_bfloat16:
        x = torch.randn(3, 8).bfloat16()
        on_the_fly = amx_utils.apply_linear(x, bfloat16.detach().clone())
        torch.testing.assert_close(on_the_fly, amx_utils.apply_linear(x, bfloat16), atol=0, rtol=2**-7)


def by_feature(blocked: torch.Tensor) -> torch.Tensor:
    """A copy from ``block_weight`` back as ``[blocks * width, in]``, from either layout (pairs of ks or not)."""
    if blocked.dim() == 4:  # [blocks, in / 2, width, 2]
        return blocked.permute(0, 2, 1, 3).reshape(blocked.shape[0] * blocked.shape[2], -1)
    return blocked.transpose(1, 2).reshape(-1, blocked.shape[1])


def makes_pairs(dtype: torch.dtype, in_features: int) -> bool:
    """Whether ``block_weight`` stores this weight in pairs of ks: bfloat16 of an even ``in`` where the CPU has
    AVX512-BF16 (its flag in /proc/cpuinfo)."""
    if dtype != torch.bfloat16 or in_features % 2 or not sys.platform.startswith("linux"):
        return False
    with open("/proc/cpuinfo") as cpuinfo:
        return " avx512_bf16" in cpuinfo.read() and torch.backends.cpu.get_cpu_capability() == "AVX512"


def packed_with_copy(
    keep_copy, dtype: torch.dtype, out_features: int = 48
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An ``out_features`` x 40 weight, a bias, and the weight as ``prepack_weight`` leaves it, after ``keep_copy``."""
    weight, bias = torch.randn(out_features, 40).to(dtype), torch.randn(out_features).to(dtype)
    packed = amx_utils.prepack_weight(weight)
    keep_copy(packed, weight)
    return weight, bias, packed


def assert_copy_read_by(packed, weight, bias, cases, reads_doubled_copy) -> None:
    """``apply_linear`` at each (rows, with bias) case equals the plain layer's values, twice them where the rows
    read the copy the test doubled (``reads_doubled_copy(rows)``)."""
    for rows, use_bias in cases:
        x = torch.randn(rows, weight.shape[1]).to(weight.dtype)
        out = amx_utils.apply_linear(x, packed, bias if use_bias else None)
        scale = 2 if reads_doubled_copy(rows) else 1
        ref = torch.nn.functional.linear(x.double(), scale * weight.double())
        ref = ref + bias.double() if use_bias else ref
        atol = 1e-4 if weight.dtype == torch.float32 else 0.1
        torch.testing.assert_close(out.double(), ref, atol=atol, rtol=0.02)


@pytest.mark.parametrize("faster", [False, True], ids=["aten", "blocked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocked_copy_serves_few_rows_only_and_matches_plain_linear(monkeypatch, faster, dtype):
    """Where the C++ kernel is the faster (forced either way), a weight of either dtype gets a column-blocked copy
    (50 features in blocks of the kernel's width, 16 or 32, the last zero-padded), and only 2-D inputs of up to
    BLOCKED_MAX_ROWS rows read it. Every row count gives the plain layer's values."""
    monkeypatch.setattr(amx_utils, "blocked_linear_is_faster", lambda dtype: faster)
    weight, bias, packed = packed_with_copy(amx_utils.keep_blocked_copy, dtype, out_features=50)
    assert hasattr(packed, "blocked_weight") == faster
    if faster:
        copy = packed.blocked_weight
        assert copy.dim() == (4 if makes_pairs(dtype, 40) else 3) and copy.is_contiguous()
        features = by_feature(copy)
        assert features.shape == (-(-50 // copy.shape[2]) * copy.shape[2], 40)
        assert torch.equal(features[:50], weight) and not features[50:].any()  # the padding features: zero
        packed.blocked_weight.mul_(2)  # a copy that few rows alone read: doubled, their outputs double
    cases = [(1, False), (1, True), (5, True), (16, False), (17, True), (40, False)]
    assert_copy_read_by(packed, weight, bias, cases, lambda rows: faster and rows <= amx_utils.BLOCKED_MAX_ROWS)
    x = torch.randn(2, 3, 40).to(dtype)  # 3-D: F.linear's path, whose values the copy would not change
    torch.testing.assert_close(amx_utils.apply_linear(x, packed), torch.nn.functional.linear(x, weight))


@pytest.mark.parametrize(("dtype", "pairs"), [(torch.float32, True), (torch.bfloat16, True), (torch.bfloat16, False)], ids=["float32", "bfloat16", "bfloat16-widened"])  # fmt: skip
@pytest.mark.parametrize("threads", [1, 2, 5])  # 5: more threads than cores, so some take others' blocks
@pytest.mark.parametrize(("rows", "out_features", "in_features"), [(1, 48, 40), (2, 50, 129), (3, 100, 37), (4, 960, 576), (6, 40, 256), (8, 64, 1536), (13, 33, 7), (14, 70, 130), (40, 17, 300)])  # fmt: skip
@pytest.mark.parametrize("x_layout", ["contiguous", "strided"])
def test_blocked_linear_matches_float64_linear(dtype, pairs, threads, rows, out_features, in_features, x_layout):
    """The C++ kernel against float64 ``F.linear``: row counts whose last group of four has 1-4 rows (and more than
    its chunk of 16), feature counts that fill its blocks or not, inputs past one tile of ks (128) or inside one, with
    a bias and without, a strided input, on one thread, two, and more threads than blocks or cores. Float32 sums stay
    within float32 rounding; bfloat16 outputs are the float32 sum rounded once, from the copy in pairs of ks (AVX512-BF16's
    dot products, where the CPU has them and ``in`` is even) and from the widened one."""
    assert cpu_kernels_built()
    torch.manual_seed(rows)
    weight = torch.randn(out_features, in_features).to(dtype)
    bias = torch.randn(out_features).to(dtype)
    x = torch.randn(rows, in_features).to(dtype)
    x = x if x_layout == "contiguous" else x.T.contiguous().T
    pairs_before = torch.ops.minisgl_cpu.set_bfloat16_pairs(pairs)
    try:
        blocked = amx_utils.block_weight(weight)
    finally:
        torch.ops.minisgl_cpu.set_bfloat16_pairs(pairs_before)
    assert blocked.dim() == (4 if pairs and makes_pairs(dtype, in_features) else 3)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        outs = [amx_utils.blocked_linear(x, blocked, b, out_features) for b in (None, bias)]
    finally:
        torch.set_num_threads(before)
    for out, b in zip(outs, (None, bias)):
        ref = torch.nn.functional.linear(x.double(), weight.double(), None if b is None else b.double())
        assert out.dtype == dtype and out.shape == (rows, out_features)
        tolerance = {"atol": 1e-4, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-3, "rtol": 2**-8}
        torch.testing.assert_close(out.double(), ref, **tolerance)


@pytest.mark.parametrize("ahead", amx_utils.SINGLE_ROW_PREFETCH_CHOICES)
def test_blocked_linear_single_row_at_each_prefetch_distance(ahead):
    """A single row streams with the distance the probe may set, at each of its choices: the same products (a
    distance past the end of the copy, as 16 KiB is for the last blocks here, only asks for lines; nothing is read)."""
    assert cpu_kernels_built()
    torch.manual_seed(ahead)
    weight, x = torch.randn(200, 300), torch.randn(1, 300)
    before = torch.ops.minisgl_cpu.set_single_row_prefetch(ahead)
    try:
        out = amx_utils.blocked_linear(x, amx_utils.block_weight(weight), None, 200)
        assert torch.ops.minisgl_cpu.set_single_row_prefetch(ahead) == ahead
    finally:
        torch.ops.minisgl_cpu.set_single_row_prefetch(before)
    torch.testing.assert_close(out.double(), x.double() @ weight.double().T, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("threads", [2, 5])
def test_blocked_linear_without_work_sharing(threads):
    """With the work sharing off (bench/decode_kernels.py --levers measures what it buys), each thread runs its own
    range and no other: every block is still computed once, the same products as with it on."""
    assert cpu_kernels_built()
    torch.manual_seed(threads)
    weight, x = torch.randn(300, 200), torch.randn(3, 200)
    blocked = amx_utils.block_weight(weight)
    before_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    assert torch.ops.minisgl_cpu.set_work_sharing(False)  # on by default
    try:
        static = amx_utils.blocked_linear(x, blocked, None, 300)
        assert not torch.ops.minisgl_cpu.set_work_sharing(True)
        shared = amx_utils.blocked_linear(x, blocked, None, 300)
    finally:
        torch.ops.minisgl_cpu.set_work_sharing(True)
        torch.set_num_threads(before_threads)
    torch.testing.assert_close(static.double(), x.double() @ weight.double().T, atol=1e-4, rtol=1e-5)
    assert torch.equal(static, shared)  # each block's sums run in the same order, whichever thread runs it


def test_single_row_prefetch_probe_sets_the_fastest_distance(monkeypatch):
    """The probe keeps the distance whose pass took least (here the second, 4 KiB) and leaves it set in the
    kernel; a distance that is not a multiple of a cache line is refused."""
    assert cpu_kernels_built()
    monkeypatch.setattr(amx_utils, "_probe_weights", lambda *_: ([torch.zeros(32, 2048)], []))
    monkeypatch.setattr(amx_utils, "alternating_seconds", lambda passes, reps=7, statistic=None: [3.0, 1.0, 2.0])
    before = torch.ops.minisgl_cpu.set_single_row_prefetch(0)
    try:
        assert amx_utils.single_row_prefetch_bytes.__wrapped__() == 4096
        assert torch.ops.minisgl_cpu.set_single_row_prefetch(before) == 4096
    finally:
        torch.ops.minisgl_cpu.set_single_row_prefetch(before)
    for bad in (-64, 100):
        with pytest.raises(RuntimeError, match=f"a non-negative multiple of 64 bytes, got {bad}"):
            torch.ops.minisgl_cpu.set_single_row_prefetch(bad)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages are Linux's madvise")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_weight_puts_large_copies_on_huge_page_boundaries(dtype):
    """A copy of 2 MiB or more starts on a 2 MiB boundary, where Linux can back it with huge pages; it holds the
    blocked layout (bfloat16: in pairs of ks where the CPU makes them), and it is freed and allocated again without
    a fault."""
    assert cpu_kernels_built()
    weight = torch.randn(1200, 1000).to(dtype)  # 2.4 MB in bfloat16
    for _ in range(3):
        blocked = amx_utils.block_weight(weight)
        assert blocked.data_ptr() % (2 << 20) == 0
        features = by_feature(blocked)
        assert blocked.dim() == (4 if makes_pairs(dtype, 1000) else 3)
        assert torch.equal(features[:1200], weight) and not features[1200:].any()
        del blocked


@pytest.mark.parametrize("rows", [1, 3, 6])
@pytest.mark.parametrize("pairs", [True, False], ids=["pairs", "widened"])
def test_blocked_linear_float32_rows_over_a_bfloat16_copy(rows, pairs):
    """Float32 rows over a bfloat16 weight's copy, in pairs of ks (where made) or not: float32 products of the
    bfloat16 weights (the pairs widened, not the rows rounded), a float32 output."""
    assert cpu_kernels_built()
    torch.manual_seed(rows)
    weight, x = torch.randn(50, 70).bfloat16(), torch.randn(rows, 70)
    pairs_before = torch.ops.minisgl_cpu.set_bfloat16_pairs(pairs)
    try:
        blocked = amx_utils.block_weight(weight)
    finally:
        torch.ops.minisgl_cpu.set_bfloat16_pairs(pairs_before)
    assert blocked.dim() == (4 if pairs and makes_pairs(torch.bfloat16, 70) else 3)
    out = amx_utils.blocked_linear(x, blocked, None, 50)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), x.double() @ weight.double().T, atol=1e-4, rtol=1e-5)


def test_blocked_linear_with_no_input_features_gives_the_bias():
    """K = 0: no tile of ks, yet the sums start at zero, as ``F.linear``'s do."""
    assert cpu_kernels_built()
    blocked, bias = amx_utils.block_weight(torch.zeros(20, 0)), torch.arange(20.0)
    assert torch.equal(amx_utils.blocked_linear(torch.zeros(3, 0), blocked, bias, 20), bias.expand(3, 20))


def test_blocked_linear_rejects_a_mismatched_input():
    """An input or bias that does not fit the weight fails with the counts, not with a wrong product."""
    assert cpu_kernels_built()
    blocked = amx_utils.block_weight(torch.zeros(8, 6))
    with pytest.raises(RuntimeError, match="x has 5 features, the weight 6"):
        amx_utils.blocked_linear(torch.zeros(2, 5), blocked, None, 8)
    with pytest.raises(RuntimeError, match="the bias must be a CPU vector of 8 features"):
        amx_utils.blocked_linear(torch.zeros(2, 6), blocked, torch.zeros(7), 8)
    with pytest.raises(RuntimeError, match="the weight must come from block_weight"):
        amx_utils.blocked_linear(torch.zeros(2, 6), blocked.half(), None, 8)
    with pytest.raises(RuntimeError, match="the weight must come from block_weight"):  # 4-D, but not bfloat16 pairs
        amx_utils.blocked_linear(torch.zeros(2, 6), blocked.view(*blocked.shape[:2], -1, 2), None, 8)
    pairs = amx_utils.block_weight(torch.zeros(8, 6, dtype=torch.bfloat16))  # in pairs where the CPU makes them
    with pytest.raises(RuntimeError, match="x has 5 features, the weight 6"):
        amx_utils.blocked_linear(torch.zeros(2, 5, dtype=torch.bfloat16), pairs, None, 8)


@pytest.mark.parametrize("faster", [False, True], ids=["onednn-gemm", "mkl-gemm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemm_copy_serves_long_inputs_only_and_matches_plain_linear(monkeypatch, faster, dtype):
    """Where MKL's GEMM is the faster for long inputs (forced either way), a float32 packed weight keeps its plain
    form, and only inputs of MKL_GEMM_MIN_ROWS rows or more read it (4 here); bfloat16 never keeps one. Every
    row count gives the plain layer's values."""
    monkeypatch.setattr(amx_utils, "mkl_gemm_is_faster", lambda: faster)
    monkeypatch.setattr(amx_utils, "MKL_GEMM_MIN_ROWS", 4)
    weight, bias, packed = packed_with_copy(amx_utils.keep_gemm_copy, dtype)
    has_copy = faster and dtype == torch.float32 and packed.is_mkldnn
    assert hasattr(packed, "gemm_weight") == has_copy
    if has_copy:
        assert not packed.gemm_weight.is_mkldnn and torch.equal(packed.gemm_weight, weight)
        packed.gemm_weight = 2 * weight  # a copy that long inputs alone read: doubled, their outputs double
    assert_copy_read_by(
        packed, weight, bias, [(1, False), (3, True), (4, True), (9, False)], lambda rows: has_copy and rows >= 4
    )


@pytest.mark.parametrize("ratio", [0.85, 0.95])
def test_probes_switch_kernels_only_past_a_10_percent_margin(monkeypatch, ratio):
    """The probes' rule, on timings given to them: the alternative kernel (4 padded rows; the C++ kernel over the
    column-blocked copies; MKL over the plain weight) is chosen when it takes under 90% of the default's time, and
    not when it takes 95%."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)  # the padding probe runs on AMX CPUs only
    tiny = [torch.zeros(32, 8)]
    monkeypatch.setattr(amx_utils, "_probe_weights", lambda *_: (tiny, [amx_utils.prepack_weight(w) for w in tiny]))
    # each probe times [its alternative, the default]
    monkeypatch.setattr(amx_utils, "alternating_seconds", lambda passes, reps=7, statistic=None: [ratio, 1.0])
    monkeypatch.setattr(amx_utils, "single_row_prefetch_bytes", lambda: 0)  # probed on its own, below
    assert amx_utils._packed_rows_probe() == (4 if ratio < 0.9 else 1)
    assert amx_utils.blocked_linear_is_faster.__wrapped__(torch.float32) == (ratio < 0.9)
    if not amx_utils.prepack_weight(tiny[0]).is_mkldnn:
        return  # without oneDNN there is nothing to copy for
    assert amx_utils._mkl_gemm_probe() == (ratio < 0.9)


def test_probe_timings_alternate_the_passes(monkeypatch):
    """The probes' timer runs the passes in turn, a warm-up round first and untimed, and returns each pass's
    median over the timed rounds, or its fastest where asked; ``before_each`` runs before every pass, untimed."""
    calls, clock = [], iter(range(1000))
    monkeypatch.setattr(amx_utils.time, "perf_counter", lambda: next(clock))
    slow = iter([0, 5, 7, 9])  # extra ticks each pass of the first kernel spends: warm-up, then three rounds

    def first():
        calls.append("a")
        for _ in range(next(slow)):
            next(clock)

    medians = amx_utils.alternating_seconds([first, lambda: calls.append("b")], reps=3)
    assert calls == ["a", "b"] * 4
    assert medians == [8, 1]  # first: 6, 8, 10 ticks; second: 1 each
    calls.clear()
    slow = iter([0, 9, 5, 7])
    fastest = amx_utils.alternating_seconds([first, lambda: calls.append("b")], reps=3, statistic=min)
    assert calls == ["a", "b"] * 4 and fastest == [6, 1]
    calls.clear()
    slow = iter([0, 5, 7, 9])

    def flush():  # a benchmark's cache flush: before every pass, its ticks outside the timed span
        calls.append("flush")
        next(clock)

    flushed = amx_utils.alternating_seconds([first, lambda: calls.append("b")], reps=3, before_each=flush)
    assert calls == ["flush", "a", "flush", "b"] * 4 and flushed == [8, 1]


def test_padding_probe_runs_on_first_use_only(monkeypatch):
    """Importing the linear layers measures nothing (a fresh interpreter leaves the answer unset); the first
    prepacked model probes once, and later calls reuse the answer."""
    import subprocess
    import sys

    code = "import sys, minisgl.layers.linear; from minisgl.layers import amx_utils; sys.exit(amx_utils._min_packed_rows is not None)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    calls = []
    monkeypatch.setattr(amx_utils, "_min_packed_rows", None)
    monkeypatch.setattr(amx_utils, "_packed_rows_probe", lambda: calls.append(1) or 4)
    # the other probes, real and cached for the session, are not this test's
    monkeypatch.setattr(amx_utils, "blocked_linear_is_faster", lambda dtype: False)
    monkeypatch.setattr(amx_utils, "mkl_gemm_is_faster", lambda: False)
    linear.prepack_linear_weights(torch.nn.Sequential(linear.ReplicatedLinear(8, 8)))
    assert calls == [1] and amx_utils.min_packed_rows() == 4 and calls == [1]


def test_mlp_row_blocks_match_one_block_and_compile_once(monkeypatch):
    """LlamaMLP's row blocks (even blocks eagerly, a fixed 8 when compiled) give one block's output, and the
    compiled blocks serve every length past the block size with one graph, whatever the length modulo 8."""
    from minisgl.models import llama

    torch.manual_seed(0)
    mlp = llama.LlamaMLP(16, 24)
    for param in mlp.parameters():
        param.data.normal_()
    xs = [torch.randn(n, 16) for n in (23, 26, 31)]
    whole = [mlp(x) for x in xs]
    monkeypatch.setattr(llama, "_MLP_BLOCK_BYTES", 1)  # one row per block
    graphs = []

    def count_graphs(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module

    compiled = torch.compile(mlp, backend=count_graphs, dynamic=True)
    for x, expected in zip(xs, whole):
        torch.testing.assert_close(mlp(x), expected, atol=1e-3, rtol=1e-4)
        torch.testing.assert_close(compiled(x), expected, atol=1e-3, rtol=1e-4)
    assert len(graphs) == 1
