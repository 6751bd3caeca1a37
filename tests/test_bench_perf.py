"""bench/perf.py's decode breakdown: the linears it times read every weight byte the bandwidth floor counts (all
but the norms' few)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import math
import statistics
import sys
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from minisgl.bench_one_batch import load_model
from minisgl.layers.amx_utils import SINGLE_ROW_PREFETCH_CHOICES, prepack_weight
from minisgl.server_args import ServerArgs
from minisgl.utils.common import InputError
from reader.views import REPO_ROOT


@pytest.fixture(scope="module")
def bench_path():
    """bench/ first on sys.path, as when its scripts run: perf.py imports its sibling engines.py."""
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        yield
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))


@pytest.fixture(scope="module")
def perf(bench_path):
    spec = importlib.util.spec_from_file_location("bench_perf", REPO_ROOT / "bench" / "perf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def engines(bench_path):
    return importlib.import_module("engines")


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_qwen2"])  # untied and tied LM head
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_linears_read_the_floor_bytes(perf, engines, model, dtype, request):
    path = request.getfixturevalue(model)
    with contextlib.redirect_stdout(io.StringIO()):
        runner, _ = load_model(ServerArgs(model_path=path, dtype=dtype, max_total_tokens=256), 0)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    norms = sum(p.numel() * p.element_size() for n, p in hf.named_parameters() if "norm" in n)
    layers = engines.decode_linear_weights(runner.torch_runner.model)
    read = sum(
        math.prod(t.shape) * t.dtype.itemsize for weight, bias in layers for t in (weight, bias) if t is not None
    )
    assert read == perf.decode_bytes(hf) - norms
    # the eager engine's own weights: prepacked where this CPU's oneDNN supports the dtype
    prepacked = prepack_weight(torch.zeros(8, 8, dtype=getattr(torch, dtype))).is_mkldnn
    assert all(weight.is_mkldnn == prepacked for weight, _ in layers)
    engines.decode_linears_time(runner.torch_runner, 2)  # smoke: the inputs fit the weights of every layout


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_qwen2"])  # untied and tied LM head
def test_prefill_parts_compute_what_the_prefill_flops_count(perf, engines, model, request, monkeypatch):
    """The prefill's linears alone do every multiply-add the FLOP count gives the weights (HF's model counted; all
    but the norms' and biases' few), and its attention alone makes the call the model's extend makes, per layer."""
    from minisgl.layers.attention.torch_native_backend import TorchNativeAttnBackend

    path = request.getfixturevalue(model)
    with contextlib.redirect_stdout(io.StringIO()):
        runner, _ = load_model(ServerArgs(model_path=path, dtype="float32", max_total_tokens=256), 0)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    batch, input_len = 2, 24
    done = []
    linear = engines.apply_linear

    def counting(x, weight, bias=None):
        done.append(2 * x.shape[0] * weight.numel())
        return linear(x, weight, bias)

    monkeypatch.setattr(engines, "apply_linear", counting)
    engines.prefill_linears_time(runner.torch_runner, batch, input_len)
    small = sum(p.numel() for n, p in hf.named_parameters() if ".layers." in n and ("norm" in n or n.endswith("bias")))
    counted = perf.exact_prefill_flops(hf, batch, input_len) - perf.prefill_attention_flops(hf, batch, input_len)
    assert sum(done) / 2 == counted - 2 * small * batch * input_len  # two passes: the warm-up and the timed one

    calls = []
    attend = TorchNativeAttnBackend._attend

    def spy(q, k, v, mask, scale):
        calls.append((tuple(q.shape), tuple(k.shape), tuple(v.shape), mask, scale, q.dtype))
        return attend(q, k, v, mask, scale)

    monkeypatch.setattr(TorchNativeAttnBackend, "_attend", staticmethod(spy))
    engines.run_minisgl(runner, batch, input_len, 2, hf.config.vocab_size)
    extend_calls, calls[:] = list(calls), []
    engines.prefill_attention_time(runner.torch_runner, batch, input_len)
    layers = hf.config.num_hidden_layers
    assert len(extend_calls) == layers and calls == extend_calls * 2
    heads, head_dim = hf.config.num_attention_heads, hf.config.hidden_size // hf.config.num_attention_heads
    q_shape, k_shape = extend_calls[0][:2]
    flops = layers * 2 * q_shape[1] ** 2 * q_shape[0] * q_shape[2] * q_shape[3]
    assert (q_shape[:3], k_shape[2]) == ((batch, input_len, heads), hf.config.num_key_value_heads)
    assert flops == perf.prefill_attention_flops(hf, batch, input_len) and q_shape[3] == head_dim


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_qwen2"])  # grouped KV heads in tiny_qwen2
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_kv_bytes_are_what_the_timed_decode_steps_attend_over(perf, engines, model, dtype, request, monkeypatch):
    """The K/V count beside the floor equals what minisgl's decode attention reads in a bench run: per call, every
    request's positions so far, keys and values of the layer's KV heads, in the pool's dtype."""
    from minisgl.layers.attention.torch_native_backend import TorchNativeAttnBackend

    path = request.getfixturevalue(model)
    with contextlib.redirect_stdout(io.StringIO()):
        runner, _ = load_model(ServerArgs(model_path=path, dtype=dtype, max_total_tokens=256), 0)
    read = []
    forward_decode = TorchNativeAttnBackend.forward_decode

    def counting(self, q, k, v, layer, forward_batch):
        pool = forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id)
        per_position = 2 * layer.tp_k_head_num * layer.head_dim * pool.element_size()
        read.append(int(forward_batch.seq_lens.sum()) * per_position)
        return forward_decode(self, q, k, v, layer, forward_batch)

    monkeypatch.setattr(TorchNativeAttnBackend, "forward_decode", counting)
    batch, input_len, output_len = 2, 24, 5
    engines.run_minisgl(runner, batch, input_len, output_len, runner.torch_runner.model_config.vocab_size)
    counted = engines.meta_model(path, getattr(torch, dtype))
    assert len(read) == (output_len - 1) * counted.config.num_hidden_layers
    assert sum(read) / (output_len - 1) == perf.decode_kv_bytes(counted, batch, input_len, output_len)


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_qwen2", "smollm2"])
def test_counts_from_the_config_equal_the_loaded_models(perf, engines, model, request):
    """The parent counts FLOPs and weight bytes on a meta-device model built from the config alone: they equal the
    counts of the model HF loads from the same checkpoint (the default GGUF included), in both dtypes."""
    from minisgl.model_loader.default_model import default_model_path

    path = default_model_path() if model == "smollm2" else request.getfixturevalue(model)
    for dtype in (torch.float32, torch.bfloat16):
        counted, loaded = engines.meta_model(path, dtype), engines.load_hf(path, dtype)
        assert perf.decode_bytes(counted) == perf.decode_bytes(loaded)
        assert perf.exact_prefill_flops(counted, 8, 128) == perf.exact_prefill_flops(loaded, 8, 128)


def test_an_engine_process_reports_a_failure_and_keeps_serving(engines, tiny_llama):
    """A failed call comes back as one error naming the engine, with the engine process's own traceback (bad input:
    minisgl's one-line InputError, as it is); the process goes on to load and time the next model."""
    with engines.EngineProcess("minisgl", torch.device("cpu")) as engine:
        with pytest.raises(RuntimeError, match=r"(?s)the minisgl engine failed:.*Traceback .*in load"):
            engine.call("load", tiny_llama, "float64", 64)
        with pytest.raises(InputError, match="^model path /nonexistent does not exist"):
            engine.call("load", "/nonexistent", "float32", 64)
        engine.call("load", tiny_llama, "float32", 64)
        prefill, decode = engine.call("run", 1, 8, 3)
        assert prefill > 0 and decode > 0
    assert engine.process.exitcode == 0


def test_a_dead_engine_process_is_named_in_one_error(engines):
    """An engine process that died (killed, say, by the OOM killer) is reported as gone, with its exit code and what
    SIGKILL most often means, on the next call: not as a bare broken pipe."""
    engine = engines.EngineProcess("hf", torch.device("cpu"))
    engine.process.kill()
    engine.process.join()
    with pytest.raises(
        engines.EngineDied, match=r"^the hf engine's process died \(exit code -9, killed: out of memory\?\)$"
    ):
        engine.call("unload")
    engine.close()


def test_roofline_shares_use_the_rows_own_bandwidth_and_peak(perf):
    """A row measured in a slow phase of the VM is held to the bandwidth and peak it had: 400 MB at the row's
    40 GB/s is a 10 ms floor, half of a 20 ms step; prefill 0.4 GFLOP in 20 ms is a fifth of the row's 100 GFLOP/s."""
    row = {"dtype": "float32", "batch": 1, "decode_bytes": 400e6, "prefill_flops": 0.4e9, "read_bandwidth_bytes": 40e9,
           "matmul_peak_flops": 100e9, "minisgl_prefill_s": {"median": 0.020},
           "minisgl_decode_s": {"median": 0.020}}  # fmt: skip
    perf.add_roofline_shares(row)
    assert row["minisgl_decode_floor_share"] == pytest.approx(0.5)
    assert row["minisgl_prefill_peak_share"] == pytest.approx(0.2)


def test_prefill_ceiling_is_the_share_with_only_linears_and_attention(perf):
    """0.3 GFLOP of weights in 4 ms and 0.1 of attention in 4 ms: 75 and 25 GFLOP/s; 0.4 GFLOP in their 8 ms is
    half of a 100 GFLOP/s peak, the share the prefill would have if nothing else took time."""
    row = {"dtype": "float32", "batch": 1, "decode_bytes": 1, "prefill_flops": 0.4e9, "read_bandwidth_bytes": 1,
           "matmul_peak_flops": 100e9, "prefill_attention_flops": 0.1e9, "prefill_linears_s": {"median": 0.004},
           "prefill_attention_s": {"median": 0.004}}  # fmt: skip
    perf.add_roofline_shares(row)
    assert row["prefill_linears_flop_rate"] == pytest.approx(75e9)
    assert row["prefill_attention_flop_rate"] == pytest.approx(25e9)
    assert row["prefill_ceiling_share"] == pytest.approx(0.5)


def test_source_commit_names_the_checkout_and_its_changes(perf, tmp_path):
    """A checkout's commit is git's short name for its HEAD, marked once a tracked file differs (an untracked one
    does not count); a tree outside git, or a copy inside some other repository, has none."""
    import subprocess

    def git(cwd, *args: str) -> str:
        return subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip

    tree = tmp_path / "tree"
    git(tmp_path, "init", "-q", str(tree))
    (tree / "tracked.py").write_text("x = 1\n")
    git(tree, "add", "tracked.py")
    git(tree, "commit", "-q", "-m", "first")
    head = git(tree, "rev-parse", "HEAD")
    (tree / "untracked.py").write_text("")
    assert perf.source_commit(str(tree)) is not None and head.startswith(perf.source_commit(str(tree)))
    (tree / "tracked.py").write_text("x = 2\n")
    changed = perf.source_commit(str(tree))
    assert changed.endswith("+changes") and head.startswith(changed.removesuffix("+changes"))
    outside = tmp_path / "outside"
    outside.mkdir()
    assert perf.source_commit(str(outside)) is None
    (tree / "copy").mkdir()  # inside a repository with a commit: that commit is not the copy's
    assert perf.source_commit(str(tree / "copy")) is None


def test_prefill_levers_switch_off_what_they_name(monkeypatch):
    """bench/prefill_levers.py's "off" values really take each lever out: causal prefill takes neither the C++
    kernel nor, past one tile, the tiles, but SDPA (bfloat16 and float32), a long prefill's MLP runs as one block,
    and its linears on the packed weights even where the plain ones are kept."""
    import minisgl.layers.attention.torch_native_backend as backend_module
    from minisgl.layers import amx_utils
    from minisgl.models import llama

    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    levers = importlib.import_module("prefill_levers").LEVERS
    for module, name, off in levers.values():
        monkeypatch.setattr(module, name, off)
    tiled = []
    monkeypatch.setattr(backend_module, "causal_prefill_attention", lambda *a: tiled.append(1))
    monkeypatch.setattr(backend_module, "causal_prefill_attention_cpu", lambda *a: tiled.append(2))
    for dtype in (torch.bfloat16, torch.float32):
        for head_dim in (8, 64):  # 64: what the kernel would take
            q, k, v = (torch.zeros(1, 300, 2, head_dim, dtype=dtype) for _ in range(3))
            backend_module.TorchNativeAttnBackend._attend(q, k, v, None, 1.0)
    mlp, gate_up_calls = llama.LlamaMLP(16, 24), []
    mlp.gate_up_proj.register_forward_hook(lambda *a: gate_up_calls.append(1))
    mlp(torch.zeros(1 << 18, 16))  # 2**18 rows x 48 floats: 48 MiB of gate_up, three 16 MiB blocks when on
    assert tiled == [] and gate_up_calls == [1]
    weight = torch.randn(8, 16)
    packed = amx_utils.prepack_weight(weight)
    packed.gemm_weight = 2 * weight  # read it, and the output doubles
    x = torch.randn(1 << 12, 16)
    torch.testing.assert_close(amx_utils.apply_linear(x, packed), x @ weight.T, atol=1e-5, rtol=1e-5)


def test_smollm2_shape_has_the_default_models_parameters(engines):
    """The random-weight stand-in for SmolLM2 (GPU machines cannot fetch the GGUF) has every parameter of the real
    checkpoint's architecture, name and shape, and its norms' epsilon and RoPE: so its timings are SmolLM2's."""
    from transformers import LlamaConfig

    from minisgl.model_loader.default_model import default_model_path
    from minisgl.utils.hf_transformers_utils import get_config

    real, shape = get_config(default_model_path()), LlamaConfig(**engines.RANDOM_LLAMAS["smollm2-shape"])
    with torch.device("meta"):
        params = [
            {n: p.shape for n, p in AutoModelForCausalLM.from_config(c).named_parameters()} for c in (real, shape)
        ]
    assert params[0] == params[1]
    assert shape.rms_norm_eps == pytest.approx(real.rms_norm_eps) and shape.rope_parameters == real.rope_parameters


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workloads", "8,128"], "--workloads 8,128: each must be batch,input,output"),
        (["--output", "/nonexistent-folder/r.json"], "--output /nonexistent-folder/r.json: its folder does not exist"),
        (["--models", "gpt2"], "argument --models: invalid choice: 'gpt2'"),
    ],
)
def test_perf_refuses_bad_flags_in_one_line(perf, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        perf.parse_args(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU is visible")
def test_perf_refuses_cuda_without_a_gpu(perf, capsys):
    assert perf.cli(["--device", "cuda", "--models", "dummy134"]) == 2
    assert capsys.readouterr().err == "error: --device cuda: no CUDA device is visible here; use --device cpu\n"


def test_bfloat16_matmul_peak_times_the_kernel_minisgl_runs(perf, monkeypatch):
    """The peak's two kernels: HF's ``F.linear`` on the bfloat16 matrices, and minisgl's linear, which on a CPU
    without bfloat16 arithmetic (forced here) multiplies a float32 copy in oneDNN (seen from its inputs' dtype)."""
    from minisgl.layers import amx_utils

    monkeypatch.setattr(amx_utils, "CPU_MULTIPLIES_BFLOAT16", False)  # forcing True would fail on an AVX2 CPU
    monkeypatch.setattr(amx_utils, "min_packed_rows", lambda: 1)  # an unprobed AMX CPU would probe in the spy
    onednn_inputs, real = [], torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(
        torch.ops.mkldnn, "_linear_pointwise", lambda x, *a: onednn_inputs.append(x.dtype) or real(x, *a)
    )
    timed = []
    monkeypatch.setattr(perf, "best_time", lambda fn, reps, device: timed.append(fn()) or 1.0)
    monkeypatch.setattr(torch, "randn", lambda *shape, **kw: torch.ones(64, 64, dtype=kw["dtype"]))  # small
    assert perf.matmul_peak(dtype=torch.bfloat16, reps=1) == 2 * 2048**3  # 2048-square FLOPs in one "second"
    assert [out.dtype for out in timed] == [torch.bfloat16] * 2 and torch.equal(timed[0], timed[1])
    assert onednn_inputs == [torch.float32]


def test_perf_runs_end_to_end_and_leaves_no_scratch(perf, tmp_path, monkeypatch):
    """A tiny whole run: the JSON holds one row for the workload asked, timed by each engine asked at each repetition
    with a bandwidth and a matmul peak sample before each run, and the random-weight checkpoint it saved (half a GB
    for dummy134 in float32) is gone afterwards, and so is the row kept in results.json.partial while it ran."""
    import json
    import tempfile

    import torch._dynamo  # noqa: F401  (imported by transformers' models; it makes Inductor's cache dir in the temp dir)

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "results.json"
    argv = ["--models", "dummy134", "--dtypes", "float32", "--workloads", "1,8,3", "--reps", "2",
            "--engines", "minisgl", "hf", "--output", str(out)]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert perf.cli(argv) == 0
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and len(data["rows"]) == 1
    # the matmul peak of the dtype asked for only (a bfloat16 probe takes seconds on a CPU without bfloat16 arithmetic)
    assert "matmul_float32_flops" in data["peaks"] and "matmul_bfloat16_flops" not in data["peaks"]
    row = data["rows"][0]
    assert (row["model"], row["dtype"], row["batch"], row["input"], row["output"]) == ("dummy134", "float32", 1, 8, 3)
    assert all(len(row[f"{e}_{phase}_s"]["samples"]) == 2 for e in ("minisgl", "hf") for phase in ("prefill", "decode"))
    # a bandwidth sample before each engine's run of the row, and the run-wide list: one before, the row's, one after
    assert len(row["read_bandwidth_samples"]) == 4 and len(row["decode_linears_s"]["samples"]) == 2
    assert all(len(row[f"prefill_{part}_s"]["samples"]) == 2 for part in ("linears", "attention"))
    assert data["peaks"]["read_bandwidth_samples"][1:-1] == row["read_bandwidth_samples"]
    assert len(row["matmul_peak_samples"]) == 4 and row["matmul_peak_flops"] == statistics.median(
        row["matmul_peak_samples"]
    )
    assert row["minisgl_prefill_peak_share"] == pytest.approx(
        row["prefill_flops"] / row["minisgl_prefill_s"]["median"] / row["matmul_peak_flops"]
    )
    assert data["process_per_engine"] is True
    has_bfloat16_kernels = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert data["machine"]["bfloat16_float32_copies"] == (not has_bfloat16_kernels)
    assert data["machine"]["single_row_prefetch"] in SINGLE_ROW_PREFETCH_CHOICES
    assert data["commit"] == perf.source_commit()  # None where the tests run outside a git checkout
    assert "compiled_prefill_s" not in row and row["decode_speedup"] > 0
    # the engine process's own probe answers (which noise may tip apart from this process's: only their kinds here)
    (probes,) = row["probes"].values()
    assert list(row["probes"]) == ["minisgl"] and probes["padded_rows"] in (1, 4)
    assert type(probes["mkl_gemm_copies"]) is bool
    assert {type(kept) for kept in probes["blocked_copies"].values()} == {bool}
    assert list(probes["blocked_copies"]) == ["float32", "bfloat16"]
    assert probes["single_row_prefetch"] in SINGLE_ROW_PREFETCH_CHOICES
    assert list(scratch.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "tmp"]


def test_each_timed_run_follows_the_probes_and_a_warm_up_of_its_workload(perf, tiny_llama, monkeypatch):
    """run_row, on fake engines: per repetition and engine, the probes, then an untimed prefill of the same workload
    (output 2) in that engine, then the timed run; only the timed runs' figures become the row's samples."""
    calls = []

    class FakeEngine:
        def __init__(self, name):
            self.name = name

        def call(self, method, *args):
            calls.append((self.name, method, *args))
            if method == "run":  # warm-ups take 9 s, timed runs 1 s: a warm-up in the samples would show
                return (9.0, 9.0) if args[2] == 2 else (1.0, 0.1)
            return (0.5, 0.5) if method == "prefill_parts" else 0.5

    monkeypatch.setattr(perf, "read_bandwidth", lambda device: calls.append(("probe", "bandwidth")) or 3e10)
    monkeypatch.setattr(perf, "matmul_peak", lambda device, dtype, reps: calls.append(("probe", "peak")) or 1e11)
    args = SimpleNamespace(reps=2)
    engines = {name: FakeEngine(name) for name in ("minisgl", "hf")}
    counted = perf.meta_model(tiny_llama, torch.float32)

    row = perf.run_row(args, torch.device("cpu"), engines, "tiny", "float32", counted, (1, 8, 3))

    turn = lambda name: [("probe", "bandwidth"), ("probe", "peak"), (name, "run", 1, 8, 2), (name, "run", 1, 8, 3)]
    repetition = turn("minisgl") + turn("hf") + [("minisgl", "linears", 1), ("minisgl", "prefill_parts", 1, 8)]
    first_warm_ups = [("minisgl", "run", 1, 8, 3), ("hf", "run", 1, 8, 3)]  # compiles, before any timing
    assert calls == first_warm_ups + repetition * 2 + [("minisgl", "probes")]  # the engine's own kernel choices
    assert all(row[f"{e}_prefill_s"]["samples"] == [1.0, 1.0] for e in engines)
    assert all(row[f"{e}_decode_s"]["samples"] == [0.1, 0.1] for e in engines)


def test_a_stopped_run_keeps_its_rows_and_resume_runs_only_the_rest(
    perf, engines, tiny_llama, tmp_path, monkeypatch, capsys
):
    """The engines' processes die in the bfloat16 half of a run: the float32 row is kept in <output>.partial, the
    run ends in one line (exit 1) that says so, and no results file is written. A plain rerun refuses to overwrite
    the kept row, a --resume with other repetitions refuses to mix them in; --resume then runs only the bfloat16
    row, in fresh processes for that model and dtype alone, and writes both rows."""
    import json

    started, dying = [], {"bfloat16"}

    class FakeProcess:
        def __init__(self, name, device):
            started.append(name)
            self.name, self.dtype = name, None

        def call(self, method, *args):
            if method == "load":
                self.dtype = args[1]
            if method == "run" and self.dtype in dying:
                raise engines.EngineDied(
                    f"the {self.name} engine's process died (exit code -9, killed: out of memory?)"
                )
            return {"run": (1.0, 0.1), "prefill_parts": (0.5, 0.5)}.get(method, 0.5)

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            pass

    monkeypatch.setattr(perf, "EngineProcess", FakeProcess)
    monkeypatch.setattr(perf, "model_paths", lambda names, scratch: {"dummy134": tiny_llama})
    monkeypatch.setattr(perf, "machine_peaks", lambda device, dtypes=(), reps=5: {"matmul_float32_flops": 1e11})
    monkeypatch.setattr(perf, "matmul_peak", lambda device, dtype, reps: 1e11)
    monkeypatch.setattr(perf, "read_bandwidth", lambda device: 3e10)
    out = tmp_path / "results.json"
    partial = tmp_path / "results.json.partial"
    argv = ["--models", "dummy134", "--dtypes", "float32", "bfloat16", "--workloads", "1,8,3", "--reps", "1",
            "--engines", "minisgl", "hf", "--output", str(out)]  # fmt: skip

    assert perf.cli(argv) == 1
    err = capsys.readouterr().err
    assert err == (f"error: the minisgl engine's process died (exit code -9, killed: out of memory?). The finished "
                   f"row is kept in {partial}: the same command with --resume runs the rest.\n")  # fmt: skip
    assert not out.exists() and started == ["minisgl", "hf", "minisgl", "hf"]  # fresh processes per dtype
    kept = json.loads(partial.read_text())["rows"]
    assert [(row["dtype"], row["batch"]) for row in kept] == [("float32", 1)]

    assert perf.cli(argv) == 2  # a plain rerun would overwrite the kept row
    assert capsys.readouterr().err == (f"error: {partial} holds an unfinished run: add --resume to finish it, or "
                                       "delete it to start over\n")  # fmt: skip
    assert perf.cli([*argv, "--reps", "2", "--resume"]) == 2  # --reps 2 against the kept run's 1
    assert "has reps 1, this one 2" in capsys.readouterr().err

    dying.clear()
    started.clear()
    assert perf.cli([*argv, "--resume"]) == 0
    assert started == ["minisgl", "hf"]  # the float32 row was not run again
    rows = json.loads(out.read_text())["rows"]
    assert [(row["dtype"], row["batch"]) for row in rows] == [("float32", 1), ("bfloat16", 1)]
    assert rows[0] == kept[0] and not partial.exists()


@pytest.mark.parametrize(
    ("kept", "message"),
    [(None, "no unfinished run at {path}; run without --resume"),
     ("[1, 2]", "{path} is not an unfinished run of bench/perf.py (no rows); delete it")],
)  # fmt: skip
def test_resume_without_an_unfinished_run_is_refused_in_one_line(perf, tmp_path, capsys, kept, message):
    out, path = tmp_path / "results.json", tmp_path / "results.json.partial"
    if kept is not None:
        path.write_text(kept)
    assert perf.cli(["--output", str(out), "--resume"]) == 2
    assert capsys.readouterr().err == f"error: --resume: {message.format(path=path)}\n"


def test_prefill_levers_script_runs_both_levers(monkeypatch, capsys):
    """``python bench/prefill_levers.py`` on a small workload: a row per lever, each timed off and on."""
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    levers = importlib.import_module("prefill_levers")
    levers.main(["--models", "dummy134", "--dtypes", "float32", "--workloads", "1,16", "--reps", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if "dummy134" in line]
    assert [next(lever for lever in levers.LEVERS if lever in row) for row in rows] == list(levers.LEVERS)


@pytest.fixture
def decode_kernels(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    return importlib.import_module("decode_kernels")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernel_variants_all_compute_the_linear(decode_kernels, dtype):
    """Every kernel bench/decode_kernels.py times returns each weight's x @ W^T (float64 reference), at row counts
    below, at and past the padding's four."""
    torch.manual_seed(0)
    plain = [torch.randn(48, 40).to(dtype), torch.randn(24, 48).to(dtype)]
    kernels = decode_kernels.kernel_variants(plain)
    assert set(kernels) >= {decode_kernels.BLOCKED, decode_kernels.PLAIN}
    for rows in (1, 3, 4, 6):
        xs = [torch.randn(rows, w.shape[1]).to(dtype) for w in plain]
        refs = [x.double() @ w.double().t() for x, w in zip(xs, plain)]
        for name, kernel in kernels.items():
            for out, ref in zip(kernel(xs), refs):
                assert out.shape == ref.shape, name
                torch.testing.assert_close(out.double(), ref, atol=1e-4 if dtype == torch.float32 else 0.1, rtol=0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernel_levers_all_compute_the_linear(decode_kernels, dtype):
    """``--levers``: every variant of the C++ kernel (the loaded one, the two other prefetch distances, 4 KiB pages,
    the static split, and the widened copies where bfloat16 ones are pairs of ks) returns x @ W^T (float64
    reference) at one row and several; afterwards the kernel runs as loaded again, and makes pairs again."""
    from minisgl.layers import amx_utils

    torch.manual_seed(1)
    plain = [torch.randn(48, 40).to(dtype), torch.randn(24, 48).to(dtype)]
    pairs = amx_utils.block_weight(plain[0]).dim() == 4  # bfloat16 on a CPU with AVX512-BF16
    levers = decode_kernels.kernel_levers(plain)
    assert len(levers) == 5 + pairs and decode_kernels.AS_LOADED in levers
    assert (decode_kernels.WIDENED in levers) == pairs and amx_utils.block_weight(plain[0]).dim() == 3 + pairs
    for rows in (1, 3):
        xs = [torch.randn(rows, w.shape[1]).to(dtype) for w in plain]
        for name, kernel in levers.items():
            for out, x, w in zip(kernel(xs), xs, plain):
                ref = x.double() @ w.double().t()
                tolerance = {"atol": 1e-4 if dtype == torch.float32 else 0.1, "rtol": 0.02}
                torch.testing.assert_close(out.double(), ref, **tolerance, msg=lambda m, name=name: f"{name}: {m}")
        decode_kernels.restore_levers()
        assert torch.ops.minisgl_cpu.set_work_sharing(True)
        loaded = amx_utils.single_row_prefetch_bytes()
        assert torch.ops.minisgl_cpu.set_single_row_prefetch(loaded) == loaded


def test_decode_kernels_levers_table(decode_kernels, monkeypatch, capsys):
    """``python bench/decode_kernels.py --levers`` on dummy134: a row per dtype and row count, a time in every lever's
    column (the prefetch distances only at one row; the widened copies only for bfloat16, where its copies are pairs
    of ks) and the bandwidth samples around it."""
    from minisgl.layers import amx_utils

    monkeypatch.setattr(decode_kernels, "read_bandwidth", lambda: 42e9)  # a 1 GiB read per sample: not needed here
    argv = ["--levers", "--models", "dummy134", "--dtypes", "float32", "bfloat16", "--rows", "1", "2", "--reps", "1"]
    decode_kernels.main(argv)
    rows = [line.split("│")[1:-1] for line in capsys.readouterr().out.splitlines() if "dummy134" in line]
    assert [[cell.strip() for cell in row][1:4] for row in rows] == [
        [dtype, rows, "42.0"] for dtype in ("float32", "bfloat16") for rows in ("1", "2")
    ]
    times = [[float(cell) if cell.strip() != "-" else None for cell in row[4:-1]] for row in rows]
    pairs = amx_utils.block_weight(torch.zeros(32, 768, dtype=torch.bfloat16)).dim() == 4
    for (one_row, two_rows), widened in zip((times[:2], times[2:]), (False, pairs)):
        assert [t is None for t in one_row] == [False] * 5 + [not widened]
        assert [t is None for t in two_rows] == [False, True, True, False, False, not widened]
    assert all(t > 0 for row in times for t in row if t is not None)
    assert all(row[-1].strip() == "42.0" for row in rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("blocked_copies", [False, True])
@pytest.mark.parametrize("padded_rows", [1, 4])
def test_decode_kernels_marks_the_kernel_apply_linear_runs(
    decode_kernels, monkeypatch, dtype, blocked_copies, padded_rows
):
    """The kernel the table marks is the one apply_linear calls, seen from the calls it makes: the C++ kernel's
    (the blocked copy), else oneDNN's (none: F.linear, where oneDNN does not pack the dtype) with the rows it passes
    (four: padded) and their dtype (float32 for bfloat16: the float32 copies), for each answer of the two probes
    and row counts on both sides of BLOCKED_MAX_ROWS."""
    from minisgl.layers import amx_utils

    monkeypatch.setattr(amx_utils, "min_packed_rows", lambda: padded_rows)
    monkeypatch.setattr(amx_utils, "blocked_linear_is_faster", lambda dtype: blocked_copies)
    monkeypatch.setattr(decode_kernels, "min_packed_rows", lambda: padded_rows)
    monkeypatch.setattr(decode_kernels, "blocked_linear_is_faster", lambda dtype: blocked_copies)
    weight = torch.randn(48, 40).to(dtype)
    packed = amx_utils.prepack_weight(weight)
    kernels = decode_kernels.kernel_variants([weight])
    amx_utils.keep_blocked_copy(packed, weight)
    amx_utils.keep_float32_copy(packed)
    calls = []
    real_onednn, real_blocked = torch.ops.mkldnn._linear_pointwise, amx_utils.blocked_linear
    spy = lambda x, *a: calls.append((len(x), x.dtype)) or real_onednn(x, *a)  # noqa: E731
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    monkeypatch.setattr(amx_utils, "blocked_linear", lambda *a: calls.append("blocked") or real_blocked(*a))
    for rows in (1, 2, 4, 8, amx_utils.BLOCKED_MAX_ROWS + 1):
        calls.clear()
        amx_utils.apply_linear(torch.randn(rows, 40).to(dtype), packed)
        if calls == ["blocked"]:
            ran = decode_kernels.BLOCKED
        elif not calls:
            ran = decode_kernels.PLAIN
        elif calls[0][1] != dtype:
            ran = decode_kernels.FLOAT32
        else:
            ran = decode_kernels.PACKED if calls == [(rows, dtype)] else decode_kernels.PADDED
        assert decode_kernels.picked_kernel(dtype, rows, kernels) == ran, (rows, calls)


def test_decode_kernels_script_prints_a_row_per_dtype_and_rows(decode_kernels, capsys):
    """``python bench/decode_kernels.py`` on the default model: one row per row count, every kernel's rate."""
    decode_kernels.main(["--dtypes", "bfloat16", "--rows", "1", "4", "--reps", "1"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "smollm2" in line]
    assert len(rows) == 2 and all(line.count("*") == 1 for line in rows)
    assert "the probes here" in out


def test_decode_phases_script_puts_each_run_between_two_probes(monkeypatch, tiny_llama, capsys):
    """``python bench/decode_phases.py``: one warm-up run, then each timed run with a probe sample right before and
    right after it, in that order; the table has one line per run."""
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    phases = importlib.import_module("decode_phases")
    calls = []

    class Recorder:
        def run(self, *workload):
            calls.append(("run", workload))
            return 0.1, 0.002 * len(calls)

    monkeypatch.setattr(phases, "read_bandwidth", lambda: calls.append(("probe",)) or 3e10)
    results = phases.measure(Recorder(), (1, 8, 3), 2)
    assert calls == [("run", (1, 8, 3)), ("probe",), ("run", (1, 8, 3)), ("probe",), ("probe",),
                     ("run", (1, 8, 3)), ("probe",)]  # fmt: skip
    assert results == [(3e10, 0.006, 3e10), (3e10, 0.012, 3e10)]
    monkeypatch.setattr(phases, "model_paths", lambda names, scratch: {names[0]: str(tiny_llama)})
    phases.main(["--engine", "minisgl", "--workload", "1,8,3", "--runs", "2"])
    out = capsys.readouterr().out
    assert (
        "minisgl dummy134 float32 1,8,3" in out and sum(line.strip().startswith("│ ") for line in out.splitlines()) == 2
    )


@pytest.fixture
def decode_attention(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    return importlib.import_module("decode_attention")


def test_decode_attention_layers_have_the_models_head_shapes(decode_attention, tmp_path):
    """bench/decode_attention.py's layers, those of minisgl's models built from the configs: SmolLM2's from its GGUF
    (9 query heads on 3 KV heads of 64, 30 layers) and dummy134's (12 heads of 64, 12 layers)."""
    paths = decode_attention.model_paths(["smollm2", "dummy134"], str(tmp_path))
    layers_of = {name: decode_attention.attention_layers(path) for name, path in paths.items()}
    shapes = {
        name: {(layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim, layer.scaling) for layer in layers}
        for name, layers in layers_of.items()
    }
    counts = {name: len(layers) for name, layers in layers_of.items()}
    assert shapes == {"smollm2": {(9, 3, 64, 0.125)}, "dummy134": {(12, 12, 64, 0.125)}}
    assert counts == {"smollm2": 30, "dummy134": 12}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_passes_attend_over_each_requests_positions(decode_attention, dtype):
    """The timed passes (eager on the C++ kernel, sdpa, compiled) return every layer's attention of each request over its own cached
    positions plus the new token (a float64 reference), and write the new token's K/V; the floor counts exactly
    the K/V bytes that reference reads."""
    from tests.test_decode_attention import naive_decode_attention

    torch.manual_seed(0)
    layers = [decode_attention.RadixAttention(6, 8, 8**-0.5, 2, layer_id) for layer_id in range(2)]
    pool = decode_attention.kv_pool(layers, dtype, 3 * 12)
    step = torch.compile(decode_attention.all_layers_step, dynamic=True)
    for batch, context in [(3, 11), (2, 5)]:
        forward_batch = decode_attention.decode_batch(pool, batch, context)
        slots = [
            forward_batch.req_to_token_pool.req_to_token[row, : context + 1].tolist() for row in range(1, batch + 1)
        ]
        assert sorted(s for request in slots for s in request) == list(range(1, batch * (context + 1) + 1))
        q, k, v = qkv = decode_attention.new_tokens(layers, forward_batch)
        assert q.shape == (batch, 6, 8) and k.shape == v.shape == (batch, 2, 8) and q.dtype == dtype
        passes = decode_attention.attention_passes(layers, forward_batch, step, qkv)
        assert len(passes) == len(decode_attention.PASSES)
        for attention_pass in passes:
            for buffers in (pool.k_buffer, pool.v_buffer):
                for buffer in buffers:
                    buffer[forward_batch.out_cache_loc] = 0  # the pass must write the new token's K/V itself
            for layer, out in zip(layers, attention_pass()):
                k_buffer, v_buffer = pool.k_buffer[layer.layer_id], pool.v_buffer[layer.layer_id]
                assert torch.equal(k_buffer[forward_batch.out_cache_loc], k)
                assert torch.equal(v_buffer[forward_batch.out_cache_loc], v)
                expected = naive_decode_attention(q, k_buffer, v_buffer, slots, 3, layer.scaling)
                tolerance = 1e-5 if dtype == torch.float32 else 2e-2
                torch.testing.assert_close(out.double().view(batch, 6, 8), expected, atol=tolerance, rtol=tolerance)
        positions = batch * (context + 1)
        assert decode_attention.kv_bytes(forward_batch) == 2 * positions * 2 * 8 * pool.k_buffer[0].element_size()


def test_decode_attention_script_prints_the_floor_of_each_row(decode_attention, monkeypatch, capsys):
    """``python bench/decode_attention.py``: a row per batch and context, its floor one layer's K/V bytes at the
    sampled bandwidth (here a fixed 1e9 B/s), each pass's share of it below 100%."""
    layers = [decode_attention.RadixAttention(4, 64, 0.125, 2, layer_id) for layer_id in range(2)]
    monkeypatch.setattr(decode_attention, "model_paths", lambda names, scratch: dict.fromkeys(names, "unused"))
    monkeypatch.setattr(decode_attention, "attention_layers", lambda path: layers)
    monkeypatch.setattr(decode_attention, "read_bandwidth", lambda: 1e9)
    decode_attention.main(["--models", "dummy134", "--batches", "1", "2", "--contexts", "31", "--reps", "1"])
    out = capsys.readouterr().out
    assert "dummy134 float32: decode attention" in out
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if " x 31" in line]
    assert [cells[0] for cells in rows] == ["1 x 31", "2 x 31"]
    for cells, batch in zip(rows, (1, 2)):
        kv_bytes = 2 * batch * 32 * 2 * 64 * 4  # K and V, 32 positions, 2 KV heads of 64 float32 values
        assert float(cells[1]) == pytest.approx(kv_bytes / 1e6, abs=0.005)
        assert float(cells[3]) == pytest.approx(kv_bytes / 1e9 * 1e6, abs=0.05)
        assert all(0 < int(cell.rstrip("%")) < 100 for cell in cells[7:10])
