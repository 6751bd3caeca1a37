"""The engines ``bench/perf.py`` times, each in a process of its own, and the models they run.

An ``EngineProcess`` is one engine (``minisgl`` eager, ``compiled``, ``hf``) served from a spawned process for the
whole benchmark: the parent sends it a model to load, then workloads to run, one at a time, so that the engines
alternate while each keeps its own heap, threads and compiled graphs. A minisgl engine runs the bench's own code
(``load_model`` + ``latency_test_run_once``); its runner sets the glibc heap settings it makes on CPU
(``keep_freed_cpu_memory``) in that process only, and HF runs under glibc's defaults, as a user would run it.
"""

from __future__ import annotations

import contextlib
import gc
import io
import multiprocessing
import os
import signal
import statistics
import time
import traceback
from multiprocessing.connection import Connection

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LogitsProcessor, LogitsProcessorList  # noqa: E402

from minisgl.bench_one_batch import latency_test_run_once, load_model, prepare_synthetic_inputs_for_latency_test  # noqa: E402
from minisgl.layers.amx_utils import (  # noqa: E402
    apply_linear,
    blocked_copies,
    min_packed_rows,
    mkl_gemm_is_faster,
    single_row_prefetch_bytes,
)
from minisgl.layers.linear import ReplicatedLinear, RowParallelLinear  # noqa: E402
from minisgl.layers.radix_attention import RadixAttention  # noqa: E402
from minisgl.model_loader.default_model import default_model_path  # noqa: E402
from minisgl.server_args import ServerArgs  # noqa: E402
from minisgl.utils.common import InputError, synchronize  # noqa: E402
from minisgl.utils.hf_transformers_utils import get_config  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ENGINES = {"minisgl": "eager", "compiled": "compiled", "hf": "HF"}  # engine -> its short name in the table
CPU = torch.device("cpu")

# Random-weight Llamas: the dummy 134M shape of issue #5, and SmolLM2-135M's own shape (its GGUF's config, which
# tests/test_bench_perf.py checks) for machines that cannot fetch the GGUF.
RANDOM_LLAMAS = {
    "dummy134": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                     num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=2048,
                     tie_word_embeddings=False),
    "smollm2-shape": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                          rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                          tie_word_embeddings=True),
}  # fmt: skip
MODELS = ["smollm2", *RANDOM_LLAMAS]


def run_times(fn, reps: int, device: torch.device = CPU) -> list[float]:
    fn()
    times = []
    for _ in range(reps):
        synchronize(device)
        tic = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - tic)
    return times


def best_time(fn, reps: int, device: torch.device = CPU) -> float:
    return min(run_times(fn, reps, device))


def _save_word_tokenizer(directory: str) -> None:
    """A one-word tokenizer: bench_one_batch loads one, and the workload is synthetic ids that never meet it."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>").save_pretrained(directory)


def model_paths(names: list[str], scratch: str) -> dict[str, str]:
    """The chosen models' paths, as minisgl's ``--model-path`` takes them (the GGUF file, or a HF directory);
    random-weight ones are saved under ``scratch``."""
    paths = {}
    if "smollm2" in names:
        paths["smollm2"] = default_model_path()
    for model_name in (n for n in names if n in RANDOM_LLAMAS):
        paths[model_name] = path = os.path.join(scratch, model_name)
        torch.manual_seed(0)
        config = LlamaConfig(**RANDOM_LLAMAS[model_name], architectures=["LlamaForCausalLM"])
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
        _save_word_tokenizer(path)
    return paths


def dummy_model(model_path: str) -> torch.nn.Module:
    """minisgl's model for ``model_path`` (rank 0, tp 1, float32) with dummy weights: its layers' shapes, from the
    config alone, built as a loaded model builds them."""
    server_args = ServerArgs(model_path=model_path, dtype="float32", max_total_tokens=256, load_format="dummy")
    with contextlib.redirect_stdout(io.StringIO()):
        return load_model(server_args, 0)[0].torch_runner.model


def load_hf(path: str | os.PathLike, dtype: torch.dtype):
    """The same weights in HF transformers: a GGUF through its ``gguf_file`` loader, a directory as it is."""
    path = os.fspath(path)
    if path.endswith(".gguf"):
        directory, name = os.path.split(path)
        return AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def meta_model(path: str | os.PathLike, dtype: torch.dtype):
    """HF's model of ``path``'s config on the meta device: its parameters' names, shapes and dtype, no weights.
    What the FLOP and byte counts read, without loading a model in the parent process."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(get_config(os.fspath(path)), dtype=dtype)


def run_minisgl(runner, batch, input_len, output_len, vocab):
    reqs = prepare_synthetic_inputs_for_latency_test(batch, input_len, output_len, vocab, seed=0)
    with contextlib.redirect_stdout(io.StringIO()):
        r = latency_test_run_once("perf", runner, print, reqs, batch, input_len, output_len, 0, False, False,
                                  ("CPU",), "", "all")  # fmt: skip
    return r["prefill_latency"], r["median_decode_latency"]


class _StepClock(LogitsProcessor):
    """Called by ``generate`` once per new token, right after that step's forward: a timestamp per step (on CUDA,
    once the step's kernels are done)."""

    def __init__(self, device: torch.device = CPU):
        self.device, self.stamps = device, []

    def __call__(self, input_ids, scores):
        synchronize(self.device)
        self.stamps.append(time.perf_counter())
        return scores


def run_hf(model, batch, input_len, output_len, vocab):
    """Prefill = start to the first step's logits; decode = median gap between later steps' logits."""
    ids = torch.randint(0, min(vocab, 10000), (batch, input_len), generator=torch.Generator().manual_seed(0))
    ids, clock = ids.to(model.device), _StepClock(model.device)
    synchronize(model.device)
    tic = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, eos_token_id=None,
                       pad_token_id=0, logits_processor=LogitsProcessorList([clock]))  # fmt: skip
    steps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
    return clock.stamps[0] - tic, statistics.median(steps)


def decode_linear_weights(model) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(weight, bias) of every linear layer of a loaded minisgl model and of its LM head, as its kernels read them."""
    layers = [(m.weight, m.bias) for m in model.modules() if isinstance(m, (ReplicatedLinear, RowParallelLinear))]
    head = model.lm_head.packed_weight if model.lm_head.packed_weight is not None else model.lm_head.weight
    return [*layers, (head, None)]


def decode_linears_time(model_runner, batch: int) -> float:
    """One decode step's weight reads alone: ``decode_linear_weights`` of the eager engine's model, with its own
    prepacked weights through ``apply_linear``, on ``batch`` rows (the fastest of three passes).

    Set beside the step time, it splits a decode step into what the linear kernels need to stream the weights and
    everything else (attention, norms, RoPE, framework time); set beside the floor, it shows how fast those
    kernels read memory.
    """
    layers = decode_linear_weights(model_runner.model)
    device = layers[0][0].device
    inputs = [torch.randn(batch, weight.shape[1], dtype=weight.dtype, device=device) for weight, _ in layers]

    def step():
        for (weight, bias), x in zip(layers, inputs):
            apply_linear(x, weight, bias)

    return best_pass(step, 3, device)


def best_pass(step, reps: int, device: torch.device) -> float:
    """The fastest of ``reps`` timed passes of ``step``, after a warm-up.

    On CUDA the pass is replayed as one CUDA graph: launched one by one, a pass's hundreds of small kernels take the
    CPU longer to queue than the GPU to run them, and the timing would be the CPU's.
    """
    if device.type == "cuda":
        step()  # cuBLAS sets up its handles and workspaces before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        step = graph.replay
    return best_time(step, reps, device)


def prefill_linears_time(model_runner, batch: int, input_len: int) -> float:
    """A prefill's weight products alone: every linear layer of the eager engine's model on the batch's
    ``batch * input_len`` tokens, and the LM head on each request's last token (all a prefill computes logits for),
    with its own prepacked weights through ``apply_linear``; one pass after a warm-up, which also sets up oneDNN's
    kernels for the row count."""
    *layers, (head, _) = decode_linear_weights(model_runner.model)
    device, tokens = head.device, batch * input_len
    inputs = {}  # one input per input width: a 32x256 prefill's inputs would take GBs, one per layer
    for weight, _ in layers:
        inputs.setdefault(weight.shape[1], torch.randn(tokens, weight.shape[1], dtype=weight.dtype, device=device))
    last_tokens = torch.randn(batch, head.shape[1], dtype=head.dtype, device=device)

    def prefill():
        for weight, bias in layers:
            apply_linear(inputs[weight.shape[1]], weight, bias)
        apply_linear(last_tokens, head)

    return best_pass(prefill, 1, device)


def prefill_attention_time(model_runner, batch: int, input_len: int) -> float:
    """A prefill's attention alone: the backend's causal attention over ``batch`` requests of ``input_len`` tokens
    with nothing cached (the call an extend of equal lengths makes, so the same kernel: the C++ prefill kernel,
    ``causal_prefill_attention`` or SDPA), once per layer on the model's head shapes; one pass after a warm-up."""
    layers = [m for m in model_runner.model.modules() if isinstance(m, RadixAttention)]
    device, dtype = model_runner.device, model_runner.model_config.dtype
    q = torch.randn(batch, input_len, layers[0].tp_q_head_num, layers[0].head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(batch, input_len, layers[0].tp_k_head_num, layers[0].head_dim, dtype=dtype, device=device)
            for _ in range(2))  # fmt: skip

    def attend():
        for layer in layers:
            model_runner.attn_backend._attend(q, k, v, None, layer.scaling)

    return best_pass(attend, 1, device)


class Engine:
    """One engine's loaded model and its timed runs, inside the engine's process."""

    def __init__(self, name: str, device: torch.device):
        self.name, self.device = name, device
        self.model = None  # HF's model, or minisgl's bench runner
        self.vocab = 0

    def load(self, path: str, dtype_name: str, max_tokens: int) -> None:
        self.unload()
        if self.name == "hf":
            self.model = load_hf(path, DTYPES[dtype_name]).eval().to(self.device)
            self.vocab = self.model.config.vocab_size
            return
        server_args = ServerArgs(model_path=path, dtype=dtype_name, max_total_tokens=max_tokens,
                                 device=str(self.device), enable_torch_compile=self.name == "compiled")  # fmt: skip
        with contextlib.redirect_stdout(io.StringIO()):
            self.model, _ = load_model(server_args, 0)
        self.vocab = self.model.torch_runner.model_config.vocab_size

    def run(self, batch: int, input_len: int, output_len: int) -> tuple[float, float]:
        """(prefill seconds, median decode step seconds) of one workload."""
        run = run_hf if self.name == "hf" else run_minisgl
        return run(self.model, batch, input_len, output_len, self.vocab)

    def linears(self, batch: int) -> float:
        return decode_linears_time(self.model.torch_runner, batch)

    def prefill_parts(self, batch: int, input_len: int) -> tuple[float, float]:
        """(linears alone, attention alone) seconds of a prefill of this workload."""
        runner = self.model.torch_runner
        return prefill_linears_time(runner, batch, input_len), prefill_attention_time(runner, batch, input_len)

    def probes(self) -> dict:
        """The kernel choices this process's probes made at load: an engine's own, which a VM's phase can tip
        the other way from the parent's (``machine_info``) where a probe's margin is near its 10%. The blocked
        copies' probe answers for both dtypes: the one the engine did not load is probed here, after its runs."""
        return {"padded_rows": min_packed_rows(), "blocked_copies": blocked_copies(),
                "single_row_prefetch": single_row_prefetch_bytes(), "mkl_gemm_copies": mkl_gemm_is_faster()}  # fmt: skip

    def unload(self) -> None:
        """Every weight goes before the next load; compiled graphs hold frozen copies of them, so they go too."""
        self.model = None
        if self.name == "compiled":
            torch._dynamo.reset()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def serve(name: str, device: str, conn: Connection) -> None:
    """An engine process's loop: ``(method, *args)`` requests in, ``(status, value)`` answers out, until exit."""
    engine = Engine(name, torch.device(device))
    if engine.device.type == "cuda" and engine.device.index is not None:  # plain "cuda" is the current one
        torch.cuda.set_device(engine.device)  # cuda:N's graphs and streams are captured on the current device
    while (request := conn.recv())[0] != "exit":
        method, *args = request
        try:
            conn.send(("ok", getattr(engine, method)(*args)))
        except InputError as e:
            conn.send(("input", str(e)))
        except Exception:  # noqa: BLE001 - the parent reports it, with this process's traceback
            conn.send(("error", traceback.format_exc()))


class EngineDied(RuntimeError):
    """An engine's process is gone: killed (out of memory, most often) or crashed."""


class EngineProcess:
    """The parent's handle on one engine process: ``call("load", ...)``, ``call("run", ...)``, then ``close()``.

    Spawned, not forked: a forked child would inherit the state and locks of the parent's thread pools without their
    threads, and could not initialize CUDA.
    """

    def __init__(self, name: str, device: torch.device):
        context = multiprocessing.get_context("spawn")
        self.name = name
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(name, str(device), child), name=f"perf-{name}", daemon=True)
        self.process.start()
        child.close()

    def call(self, method: str, *args):
        try:
            self.conn.send((method, *args))
            status, value = self.conn.recv()
        except (EOFError, OSError):  # the process is gone (a broken pipe on send, EOF on receive)
            self.process.join(5)
            code = self.process.exitcode
            # SIGKILL is what the kernel's out-of-memory killer sends
            cause = ", killed: out of memory?" if code == -signal.SIGKILL else ""
            raise EngineDied(f"the {self.name} engine's process died (exit code {code}{cause})") from None
        if status == "input":
            raise InputError(value)
        if status == "error":
            raise RuntimeError(f"the {self.name} engine failed:\n{value}")
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(("exit",))
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
