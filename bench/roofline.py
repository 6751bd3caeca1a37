"""The roofline ``bench/perf.py`` holds each row to: a workload's exact FLOPs and bytes, counted from the model's
architecture (HF's model on the meta device, ``engines.meta_model``), and the row's shares of the machine's
matmul peak and bandwidth floor. SGLang's ``bench_one_batch`` reports latency and throughput only; the roofline
is this benchmark's, after issue #5's definitions.
"""

from __future__ import annotations

from engines import DTYPES, ENGINES  # bench/engines.py: this script's folder is first on sys.path

from minisgl.configs.model_config import ModelConfig


def prefill_attention_flops(model, batch: int, input_len: int) -> float:
    """Causal attention's FLOPs: QK^T and PV over the keys each query sees, half of the full square."""
    cfg = model.config
    per_layer = 2 * input_len**2 * cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
    return batch * cfg.num_hidden_layers * per_layer


def exact_prefill_flops(model, batch: int, input_len: int) -> float:
    """Every layer weight once per token (the norms' few included), causal attention, the last-token LM head."""
    cfg = model.config
    layer_params = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n)
    weights = batch * (2 * layer_params * input_len + 2 * cfg.hidden_size * cfg.vocab_size)
    return weights + prefill_attention_flops(model, batch, input_len)


def decode_bytes(model) -> int:
    """Bytes a decode step must read: every weight but the embedding table (the LM head counts)."""
    embed = model.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    tied = model.config.tie_word_embeddings
    return total if tied else total - embed.numel() * embed.element_size()


def decode_kv_bytes(model, batch: int, input_len: int, output_len: int) -> float:
    """Bytes of cached keys and values a decode step attends over, every layer, averaged over the timed steps: step
    ``i`` (from 0; ``output_len - 1`` of them) reads ``input_len + i + 1`` positions per request, ``input_len +
    output_len / 2`` on average. Not part of the floor, which counts the weights only (issue #5's definition)."""
    cfg = ModelConfig.from_hf_config(model.config, model.dtype)  # its head_dim and KV-head defaults, as minisgl's
    per_position = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * cfg.dtype.itemsize
    return batch * per_position * (input_len + output_len / 2)


def add_roofline_shares(row: dict) -> None:
    """Prefill as a share of the matmul peak; decode as the bandwidth floor's share of the step time. Both at the
    row's own machine: the peak and the bandwidth are the medians of the samples taken right before each of its
    runs, as a shared VM's speed changes in phases."""
    floor, peak = row["decode_bytes"] / row["read_bandwidth_bytes"], row["matmul_peak_flops"]
    for engine in (e for e in ENGINES if f"{e}_prefill_s" in row):
        prefill_rate = row["prefill_flops"] / row[f"{engine}_prefill_s"]["median"]
        row[f"{engine}_prefill_peak_share"] = prefill_rate / peak
        row[f"{engine}_decode_floor_share"] = floor / row[f"{engine}_decode_s"]["median"]
    if "decode_linears_s" in row:
        seconds = row["decode_linears_s"]["median"]
        row["decode_linears_read_rate"] = row["decode_bytes"] / seconds
        # each weight element is read once and used in one multiply-add per row of the batch
        weights = row["decode_bytes"] / DTYPES[row["dtype"]].itemsize
        row["decode_linears_flop_rate"] = 2 * row["batch"] * weights / seconds
    if "prefill_linears_s" in row:
        linears, attention = (row[f"prefill_{part}_s"]["median"] for part in ("linears", "attention"))
        row["prefill_linears_flop_rate"] = (row["prefill_flops"] - row["prefill_attention_flops"]) / linears
        row["prefill_attention_flop_rate"] = row["prefill_attention_flops"] / attention
        # the share a prefill would have if everything but its linears and attention took no time
        row["prefill_ceiling_share"] = row["prefill_flops"] / (linears + attention) / peak
