"""Every minisgl piece's counterpart in SGLang 0.5.14: ``qualified name -> (SGLang qualified name, file)``.

Keyed by minisgl qualified name, so an entry moves with its code only through a rename here;
``python -m reader check`` fails when a key no longer names minisgl code, when a counterpart is missing
from SGLang's source, or when a piece on a chain has neither an entry nor a reason in ``NO_COUNTERPART``.
"""

from __future__ import annotations

SGLANG_VERSION = "0.5.14"

COUNTERPARTS: dict[str, tuple[str, str]] = {
    "minisgl.layers.amx_utils.apply_linear": (
        "UnquantizedLinearMethod.apply",
        "sglang/srt/layers/quantization/unquant.py",
    ),
    "minisgl.layers.amx_utils.prepack_weight": ("amx_process_weight_after_loading", "sglang/srt/layers/amx_utils.py"),
    "minisgl.model_executor.cpu_graph_runner.register_fake_ops": (
        "register_fake_ops",
        "sglang/srt/model_executor/cpu_graph_runner.py",
    ),
    "minisgl.layers.linear.prepack_linear_weights": (
        "UnquantizedLinearMethod.process_weights_after_loading",
        "sglang/srt/layers/quantization/unquant.py",
    ),
    "minisgl.layers.vocab_parallel_embedding.prepack_lm_head": (
        "UnquantizedLinearMethod.process_weights_after_loading",
        "sglang/srt/layers/quantization/unquant.py",
    ),
    "minisgl.bench_args.BenchArgs": ("BenchArgs", "sglang/bench_one_batch.py"),
    "minisgl.bench_args.BenchArgs.add_cli_args": ("BenchArgs.add_cli_args", "sglang/bench_one_batch.py"),
    "minisgl.bench_args.BenchArgs.from_cli_args": ("BenchArgs.from_cli_args", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch._TorchBenchRunner": ("_TorchBenchRunner", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch._TorchBenchRunner.__init__": ("_TorchBenchRunner.__init__", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch._TorchBenchRunner.cleanup": ("_TorchBenchRunner.cleanup", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch._TorchBenchRunner.clear": ("_TorchBenchRunner.clear", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch._TorchBenchRunner.decode": ("_TorchBenchRunner.decode", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch._TorchBenchRunner.extend": ("_TorchBenchRunner.extend", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch._TorchBenchRunner.max_batch_size": (
        "_TorchBenchRunner.max_batch_size",
        "sglang/bench_one_batch.py",
    ),
    "minisgl.bench_one_batch._TorchBenchRunner.synchronize": (
        "_TorchBenchRunner.synchronize",
        "sglang/bench_one_batch.py",
    ),
    "minisgl.bench_one_batch._read_prompts_from_file": ("_read_prompts_from_file", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch.correctness_test": ("correctness_test", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch.decode": ("decode", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch.extend": ("extend", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch.latency_test": ("latency_test", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch.latency_test_run_once": ("latency_test_run_once", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch.load_model": ("load_model", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch.main": ("main", "sglang/bench_one_batch.py"),
    "minisgl.bench_one_batch.prepare_extend_inputs_for_correctness_test": (
        "prepare_extend_inputs_for_correctness_test",
        "sglang/bench_one_batch.py",
    ),
    "minisgl.bench_one_batch.prepare_inputs_for_correctness_test": (
        "prepare_inputs_for_correctness_test",
        "sglang/bench_one_batch.py",
    ),
    "minisgl.bench_one_batch.prepare_synthetic_inputs_for_latency_test": (
        "prepare_synthetic_inputs_for_latency_test",
        "sglang/bench_one_batch.py",
    ),
    "minisgl.configs.model_config.ModelConfig": ("ModelConfig", "sglang/srt/configs/model_config.py"),
    "minisgl.configs.model_config.ModelConfig.from_hf_config": (
        "ModelConfig.from_server_args",
        "sglang/srt/configs/model_config.py",
    ),
    "minisgl.configs.model_config.ModelConfig.get_num_kv_heads": (
        "ModelConfig.get_num_kv_heads",
        "sglang/srt/configs/model_config.py",
    ),
    "minisgl.configs.model_config.resolve_dtype": ("_get_and_verify_dtype", "sglang/srt/configs/model_config.py"),
    "minisgl.distributed.parallel_state.destroy_distributed_environment": (
        "destroy_distributed_environment",
        "sglang/srt/distributed/parallel_state.py",
    ),
    "minisgl.distributed.parallel_state.get_tensor_model_parallel_rank": (
        "get_tensor_model_parallel_rank",
        "sglang/srt/distributed/parallel_state.py",
    ),
    "minisgl.distributed.parallel_state.get_tensor_model_parallel_world_size": (
        "get_tensor_model_parallel_world_size",
        "sglang/srt/distributed/parallel_state.py",
    ),
    "minisgl.distributed.parallel_state.init_distributed_environment": (
        "init_distributed_environment",
        "sglang/srt/distributed/parallel_state.py",
    ),
    "minisgl.distributed.parallel_state.tensor_model_parallel_all_gather": (
        "tensor_model_parallel_all_gather",
        "sglang/srt/distributed/communication_op.py",
    ),
    "minisgl.distributed.parallel_state.tensor_model_parallel_all_reduce": (
        "tensor_model_parallel_all_reduce",
        "sglang/srt/distributed/communication_op.py",
    ),
    "minisgl.layers.activation.SiluAndMul": ("SiluAndMul", "sglang/srt/layers/activation.py"),
    "minisgl.layers.activation.SiluAndMul.forward": ("SiluAndMul.forward_cpu", "sglang/srt/layers/activation.py"),
    "minisgl.layers.attention.base_attn_backend.AttentionBackend": (
        "AttentionBackend",
        "sglang/srt/layers/attention/base_attn_backend.py",
    ),
    "minisgl.layers.attention.base_attn_backend.AttentionBackend.forward": (
        "AttentionBackend.forward",
        "sglang/srt/layers/attention/base_attn_backend.py",
    ),
    "minisgl.layers.attention.base_attn_backend.AttentionBackend.forward_decode": (
        "AttentionBackend.forward_decode",
        "sglang/srt/layers/attention/base_attn_backend.py",
    ),
    "minisgl.layers.attention.base_attn_backend.AttentionBackend.forward_extend": (
        "AttentionBackend.forward_extend",
        "sglang/srt/layers/attention/base_attn_backend.py",
    ),
    "minisgl.layers.attention.base_attn_backend.AttentionBackend.init_forward_metadata": (
        "AttentionBackend.init_forward_metadata",
        "sglang/srt/layers/attention/base_attn_backend.py",
    ),
    "minisgl.layers.attention.base_attn_backend.AttentionBackend.init_forward_metadata_out_graph": (
        "AttentionBackend.init_forward_metadata_out_graph",
        "sglang/srt/layers/attention/base_attn_backend.py",
    ),
    "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend": (
        "TorchNativeAttnBackend",
        "sglang/srt/layers/attention/torch_native_backend.py",
    ),
    "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.__init__": (
        "TorchNativeAttnBackend.__init__",
        "sglang/srt/layers/attention/torch_native_backend.py",
    ),
    "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_decode": (
        "TorchNativeAttnBackend.forward_decode",
        "sglang/srt/layers/attention/torch_native_backend.py",
    ),
    "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend": (
        "TorchNativeAttnBackend.forward_extend",
        "sglang/srt/layers/attention/torch_native_backend.py",
    ),
    "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.init_forward_metadata": (
        "TorchNativeAttnBackend.init_forward_metadata",
        "sglang/srt/layers/attention/torch_native_backend.py",
    ),
    "minisgl.layers.layernorm.RMSNorm": ("RMSNorm", "sglang/srt/layers/layernorm.py"),
    "minisgl.layers.layernorm.RMSNorm.__init__": ("RMSNorm.__init__", "sglang/srt/layers/layernorm.py"),
    "minisgl.layers.layernorm.RMSNorm.forward": ("RMSNorm.forward_cpu", "sglang/srt/layers/layernorm.py"),
    "minisgl.layers.linear.ColumnParallelLinear": ("ColumnParallelLinear", "sglang/srt/layers/linear.py"),
    "minisgl.layers.linear.ColumnParallelLinear.__init__": (
        "ColumnParallelLinear.__init__",
        "sglang/srt/layers/linear.py",
    ),
    "minisgl.layers.linear.ColumnParallelLinear.weight_loader": (
        "ColumnParallelLinear.weight_loader",
        "sglang/srt/layers/linear.py",
    ),
    "minisgl.layers.linear.MergedColumnParallelLinear": ("MergedColumnParallelLinear", "sglang/srt/layers/linear.py"),
    "minisgl.layers.linear.MergedColumnParallelLinear.__init__": (
        "MergedColumnParallelLinear.__init__",
        "sglang/srt/layers/linear.py",
    ),
    "minisgl.layers.linear.MergedColumnParallelLinear.weight_loader": (
        "MergedColumnParallelLinear.weight_loader",
        "sglang/srt/layers/linear.py",
    ),
    "minisgl.layers.linear.QKVParallelLinear": ("QKVParallelLinear", "sglang/srt/layers/linear.py"),
    "minisgl.layers.linear.QKVParallelLinear.__init__": ("QKVParallelLinear.__init__", "sglang/srt/layers/linear.py"),
    "minisgl.layers.linear.QKVParallelLinear.weight_loader": (
        "QKVParallelLinear.weight_loader",
        "sglang/srt/layers/linear.py",
    ),
    "minisgl.layers.linear.ReplicatedLinear": ("ReplicatedLinear", "sglang/srt/layers/linear.py"),
    "minisgl.layers.linear.ReplicatedLinear.__init__": ("ReplicatedLinear.__init__", "sglang/srt/layers/linear.py"),
    "minisgl.layers.linear.ReplicatedLinear.forward": ("ReplicatedLinear.forward", "sglang/srt/layers/linear.py"),
    "minisgl.layers.linear.RowParallelLinear": ("RowParallelLinear", "sglang/srt/layers/linear.py"),
    "minisgl.layers.linear.RowParallelLinear.__init__": ("RowParallelLinear.__init__", "sglang/srt/layers/linear.py"),
    "minisgl.layers.linear.RowParallelLinear.forward": ("RowParallelLinear.forward", "sglang/srt/layers/linear.py"),
    "minisgl.layers.linear.RowParallelLinear.weight_loader": (
        "RowParallelLinear.weight_loader",
        "sglang/srt/layers/linear.py",
    ),
    "minisgl.layers.linear.default_weight_loader": ("default_weight_loader", "sglang/srt/model_loader/weight_utils.py"),
    "minisgl.layers.logits_processor.LogitsProcessor": ("LogitsProcessor", "sglang/srt/layers/logits_processor.py"),
    "minisgl.layers.logits_processor.LogitsProcessor.__init__": (
        "LogitsProcessor.__init__",
        "sglang/srt/layers/logits_processor.py",
    ),
    "minisgl.layers.logits_processor.LogitsProcessor.forward": (
        "LogitsProcessor.forward",
        "sglang/srt/layers/logits_processor.py",
    ),
    "minisgl.layers.logits_processor.LogitsProcessorOutput": (
        "LogitsProcessorOutput",
        "sglang/srt/layers/logits_processor.py",
    ),
    "minisgl.layers.radix_attention.RadixAttention": ("RadixAttention", "sglang/srt/layers/radix_attention.py"),
    "minisgl.layers.radix_attention.RadixAttention.__init__": (
        "RadixAttention.__init__",
        "sglang/srt/layers/radix_attention.py",
    ),
    "minisgl.layers.radix_attention.RadixAttention.forward": (
        "RadixAttention.forward",
        "sglang/srt/layers/radix_attention.py",
    ),
    "minisgl.layers.rotary_embedding.RotaryEmbedding": (
        "RotaryEmbedding",
        "sglang/srt/layers/rotary_embedding/base.py",
    ),
    "minisgl.layers.rotary_embedding.RotaryEmbedding.__init__": (
        "RotaryEmbedding.__init__",
        "sglang/srt/layers/rotary_embedding/base.py",
    ),
    "minisgl.layers.rotary_embedding.RotaryEmbedding.forward": (
        "RotaryEmbedding.forward_cpu",
        "sglang/srt/layers/rotary_embedding/base.py",
    ),
    "minisgl.layers.rotary_embedding._rotate": (
        "apply_rotary_pos_emb_native",
        "sglang/srt/layers/rotary_embedding/utils.py",
    ),
    "minisgl.layers.rotary_embedding.get_rope": ("get_rope", "sglang/srt/layers/rotary_embedding/factory.py"),
    "minisgl.layers.rotary_embedding.RotaryEmbedding._lookup": (
        "RotaryEmbedding.forward_native",
        "sglang/srt/layers/rotary_embedding/base.py",
    ),
    "minisgl.layers.radix_attention.unified_attention": (
        "unified_attention_with_output",
        "sglang/srt/layers/radix_attention.py",
    ),
    "minisgl.model_executor.cpu_graph_runner.set_torch_compile_config": (
        "set_torch_compile_config",
        "sglang/srt/model_executor/cpu_graph_runner.py",
    ),
    "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner": (
        "CPUGraphRunner",
        "sglang/srt/model_executor/cpu_graph_runner.py",
    ),
    "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.__init__": (
        "CPUGraphRunner.__init__",
        "sglang/srt/model_executor/cpu_graph_runner.py",
    ),
    "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.can_run_graph": (
        "CPUGraphRunner.can_run_graph",
        "sglang/srt/model_executor/cpu_graph_runner.py",
    ),
    "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.execute": (
        "CPUGraphRunner.execute",
        "sglang/srt/model_executor/cpu_graph_runner.py",
    ),
    "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend._attend_request": (
        "TorchNativeAttnBackend._run_sdpa_forward_extend",
        "sglang/srt/layers/attention/torch_native_backend.py",
    ),
    # One attention call over a batch whose requests have no cached prefix (and one length) reads their new k and
    # v directly, as FlashInfer's ragged prefill does when extend_no_prefix.
    "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend._attend": (
        "FlashInferAttnBackend.forward_extend",
        "sglang/srt/layers/attention/flashinfer_backend.py",
    ),
    # SGLang's CPU extend kernel (sgl_kernel extend_attention_cpu) is C++ over the paged cache, a cached prefix
    # included; minisgl's C++ kernel attends prompts with nothing cached, on their new k and v.
    "minisgl.layers.attention.cpu_prefill.causal_prefill_attention_cpu": (
        "IntelAMXAttnBackend.forward_extend",
        "sglang/srt/layers/attention/intel_amx_backend.py",
    ),
    # Where minisgl's C++ kernels are not built, its tiles put the same causal attention on oneDNN's batched matmul.
    "minisgl.layers.attention.tiled_prefill.causal_prefill_attention": (
        "IntelAMXAttnBackend.forward_extend",
        "sglang/srt/layers/attention/intel_amx_backend.py",
    ),
    # SGLang's CPU decode kernel (sgl_kernel decode_attention_cpu) likewise writes the new K/V and reads the
    # pool by slot in one call; minisgl's is generated by Inductor from plain tensor ops.
    "minisgl.layers.attention.torch_native_backend.fused_decode_attention": (
        "IntelAMXAttnBackend.forward_decode",
        "sglang/srt/layers/attention/intel_amx_backend.py",
    ),
    # The C++ kernel's call, as IntelAMXAttnBackend.forward_decode calls sgl_kernel's decode_attention_cpu (which
    # also writes the new K/V; minisgl's backend writes them first, set_kv_buffer).
    "minisgl.layers.attention.cpu_decode.decode_attention_cpu": (
        "IntelAMXAttnBackend.forward_decode",
        "sglang/srt/layers/attention/intel_amx_backend.py",
    ),
    # SGLang's CPU decode kernel splits each sequence too (8 KV splits, their partial outputs in attn_logits),
    # which its CPU-graph metadata allocates; minisgl's compiled decode wants positions in whole blocks instead.
    "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.init_forward_metadata_out_graph": (
        "IntelAMXAttnBackend.init_forward_metadata_capture_cpu_graph",
        "sglang/srt/layers/attention/intel_amx_backend.py",
    ),
    "minisgl.model_executor.runner.base_runner.BaseRunner": (
        "BaseRunner",
        "sglang/srt/model_executor/runner/base_runner.py",
    ),
    "minisgl.model_executor.runner.base_runner.BaseRunner.can_run_graph": (
        "BaseRunner.can_run_graph",
        "sglang/srt/model_executor/runner/base_runner.py",
    ),
    "minisgl.model_executor.runner.base_runner.BaseRunner.execute": (
        "BaseRunner.execute",
        "sglang/srt/model_executor/runner/base_runner.py",
    ),
    "minisgl.model_executor.model_runner.ModelRunner.init_decode_cuda_graph": (
        "ModelRunner.init_decode_cuda_graph",
        "sglang/srt/model_executor/model_runner.py",
    ),
    "minisgl.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner": (
        "DecodeCudaGraphRunner",
        "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
    ),
    "minisgl.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.__init__": (
        "DecodeCudaGraphRunner.__init__",
        "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
    ),
    "minisgl.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph": (
        "DecodeCudaGraphRunner.can_run_graph",
        "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
    ),
    "minisgl.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture": (
        "DecodeCudaGraphRunner.capture",
        "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
    ),
    "minisgl.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture_one_shape": (
        "DecodeCudaGraphRunner.capture_one_shape",
        "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
    ),
    "minisgl.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.load_batch": (
        "DecodeCudaGraphRunner.load_batch",
        "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
    ),
    "minisgl.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.execute": (
        "DecodeCudaGraphRunner.execute",
        "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
    ),
    "minisgl.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner._static_batch": (
        "DecodeCudaGraphRunner.capture_prepare",
        "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
    ),
    # the recording itself: two warm-ups outside the graph, then the capture into the shared memory pool
    "minisgl.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner._record": (
        "FullCudaGraphBackend.capture_one",
        "sglang/srt/model_executor/runner_backend/full_cuda_graph_backend.py",
    ),
    "minisgl.model_executor.runner.decode_cuda_graph_runner.generate_decode_cuda_graph_batch_sizes": (
        "ServerArgs._generate_decode_cuda_graph_batch_sizes",
        "sglang/srt/server_args.py",
    ),
    "minisgl.model_executor.runner.decode_cuda_graph_runner._pad_to_bucket": (
        "BaseCudaGraphRunner._pad_to_bucket",
        "sglang/srt/model_executor/runner/base_cuda_graph_runner.py",
    ),
    # SGLang's hook for state a warm-up left behind; minisgl's rotary table is that state
    "minisgl.layers.rotary_embedding.RotaryEmbedding.forget_lookup": (
        "AttentionBackend.on_after_cuda_graph_warmup",
        "sglang/srt/layers/attention/base_attn_backend.py",
    ),
    "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.prepare_replay": (
        "CPUGraphRunner.prepare_replay",
        "sglang/srt/model_executor/cpu_graph_runner.py",
    ),
    "minisgl.model_executor.forward_context.ForwardContext": (
        "ForwardContext",
        "sglang/srt/model_executor/forward_context.py",
    ),
    "minisgl.model_executor.forward_context.get_forward_context": (
        "get_forward_context",
        "sglang/srt/model_executor/forward_context.py",
    ),
    "minisgl.model_executor.forward_context.forward_context": (
        "forward_context",
        "sglang/srt/model_executor/forward_context.py",
    ),
    "minisgl.layers.sampler.Sampler": ("Sampler", "sglang/srt/layers/sampler.py"),
    "minisgl.layers.sampler.Sampler.forward": ("Sampler.forward", "sglang/srt/layers/sampler.py"),
    "minisgl.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch": (
        "top_k_top_p_min_p_sampling_from_probs_torch",
        "sglang/srt/layers/sampler.py",
    ),
    "minisgl.layers.vocab_parallel_embedding.ParallelLMHead": (
        "ParallelLMHead",
        "sglang/srt/layers/vocab_parallel_embedding.py",
    ),
    "minisgl.layers.vocab_parallel_embedding.VocabParallelEmbedding": (
        "VocabParallelEmbedding",
        "sglang/srt/layers/vocab_parallel_embedding.py",
    ),
    "minisgl.layers.vocab_parallel_embedding.VocabParallelEmbedding.__init__": (
        "VocabParallelEmbedding.__init__",
        "sglang/srt/layers/vocab_parallel_embedding.py",
    ),
    "minisgl.layers.vocab_parallel_embedding.VocabParallelEmbedding.forward": (
        "VocabParallelEmbedding.forward",
        "sglang/srt/layers/vocab_parallel_embedding.py",
    ),
    "minisgl.layers.vocab_parallel_embedding.VocabParallelEmbedding.weight_loader": (
        "VocabParallelEmbedding.weight_loader",
        "sglang/srt/layers/vocab_parallel_embedding.py",
    ),
    "minisgl.managers.schedule_batch.Req": ("Req", "sglang/srt/managers/schedule_batch.py"),
    "minisgl.managers.schedule_batch.Req.__init__": ("Req.__init__", "sglang/srt/managers/schedule_batch.py"),
    "minisgl.managers.schedule_batch.Req.get_fill_ids": ("Req.get_fill_ids", "sglang/srt/managers/schedule_batch.py"),
    "minisgl.managers.schedule_batch.Req.set_extend_input_len": (
        "Req.set_extend_input_len",
        "sglang/srt/managers/schedule_batch.py",
    ),
    "minisgl.managers.schedule_batch.ScheduleBatch": ("ScheduleBatch", "sglang/srt/managers/schedule_batch.py"),
    "minisgl.managers.schedule_batch.ScheduleBatch.init_new": (
        "ScheduleBatch.init_new",
        "sglang/srt/managers/schedule_batch.py",
    ),
    "minisgl.managers.schedule_batch.ScheduleBatch.prepare_for_decode": (
        "ScheduleBatch.prepare_for_decode",
        "sglang/srt/managers/schedule_batch.py",
    ),
    "minisgl.managers.schedule_batch.ScheduleBatch.prepare_for_extend": (
        "ScheduleBatch.prepare_for_extend",
        "sglang/srt/managers/schedule_batch.py",
    ),
    "minisgl.mem_cache.allocator.token.TokenToKVPoolAllocator": (
        "TokenToKVPoolAllocator",
        "sglang/srt/mem_cache/allocator/token.py",
    ),
    "minisgl.mem_cache.allocator.token.TokenToKVPoolAllocator.__init__": (
        "TokenToKVPoolAllocator.__init__",
        "sglang/srt/mem_cache/allocator/token.py",
    ),
    "minisgl.mem_cache.allocator.token.TokenToKVPoolAllocator.alloc": (
        "TokenToKVPoolAllocator.alloc",
        "sglang/srt/mem_cache/allocator/token.py",
    ),
    "minisgl.mem_cache.allocator.token.TokenToKVPoolAllocator.available_size": (
        "TokenToKVPoolAllocator.available_size",
        "sglang/srt/mem_cache/allocator/token.py",
    ),
    "minisgl.mem_cache.allocator.token.TokenToKVPoolAllocator.clear": (
        "TokenToKVPoolAllocator.clear",
        "sglang/srt/mem_cache/allocator/token.py",
    ),
    "minisgl.mem_cache.allocator.token.TokenToKVPoolAllocator.free": (
        "TokenToKVPoolAllocator.free",
        "sglang/srt/mem_cache/allocator/token.py",
    ),
    "minisgl.mem_cache.common.alloc_for_decode": ("alloc_for_decode", "sglang/srt/mem_cache/common.py"),
    "minisgl.mem_cache.common.alloc_for_extend": ("alloc_for_extend", "sglang/srt/mem_cache/common.py"),
    "minisgl.mem_cache.common.alloc_req_slots": ("alloc_req_slots", "sglang/srt/mem_cache/common.py"),
    "minisgl.mem_cache.common.alloc_token_slots": ("alloc_token_slots", "sglang/srt/mem_cache/common.py"),
    "minisgl.mem_cache.memory_pool.MHATokenToKVPool": ("MHATokenToKVPool", "sglang/srt/mem_cache/memory_pool.py"),
    "minisgl.mem_cache.memory_pool.MHATokenToKVPool.__init__": (
        "MHATokenToKVPool.__init__",
        "sglang/srt/mem_cache/memory_pool.py",
    ),
    "minisgl.mem_cache.memory_pool.MHATokenToKVPool.get_cell_size_per_token": (
        "DefaultPoolConfigurator._compute_cell_size",
        "sglang/srt/model_executor/pool_configurator.py",
    ),
    "minisgl.mem_cache.memory_pool.MHATokenToKVPool.get_key_buffer": (
        "MHATokenToKVPool.get_key_buffer",
        "sglang/srt/mem_cache/memory_pool.py",
    ),
    "minisgl.mem_cache.memory_pool.MHATokenToKVPool.get_value_buffer": (
        "MHATokenToKVPool.get_value_buffer",
        "sglang/srt/mem_cache/memory_pool.py",
    ),
    "minisgl.mem_cache.memory_pool.MHATokenToKVPool.set_kv_buffer": (
        "MHATokenToKVPool.set_kv_buffer",
        "sglang/srt/mem_cache/memory_pool.py",
    ),
    "minisgl.mem_cache.memory_pool.ReqToTokenPool": ("ReqToTokenPool", "sglang/srt/mem_cache/memory_pool.py"),
    "minisgl.mem_cache.memory_pool.ReqToTokenPool.__init__": (
        "ReqToTokenPool.__init__",
        "sglang/srt/mem_cache/memory_pool.py",
    ),
    "minisgl.mem_cache.memory_pool.ReqToTokenPool.alloc": (
        "ReqToTokenPool.alloc",
        "sglang/srt/mem_cache/memory_pool.py",
    ),
    "minisgl.mem_cache.memory_pool.ReqToTokenPool.available_size": (
        "ReqToTokenPool.available_size",
        "sglang/srt/mem_cache/memory_pool.py",
    ),
    "minisgl.mem_cache.memory_pool.ReqToTokenPool.clear": (
        "ReqToTokenPool.clear",
        "sglang/srt/mem_cache/memory_pool.py",
    ),
    "minisgl.mem_cache.memory_pool.ReqToTokenPool.free": ("ReqToTokenPool.free", "sglang/srt/mem_cache/memory_pool.py"),
    "minisgl.model_executor.forward_batch_info.ForwardBatch": (
        "ForwardBatch",
        "sglang/srt/model_executor/forward_batch_info.py",
    ),
    "minisgl.model_executor.forward_batch_info.ForwardBatch.init_new": (
        "ForwardBatch.init_new",
        "sglang/srt/model_executor/forward_batch_info.py",
    ),
    "minisgl.model_executor.forward_batch_info.ForwardMode": (
        "ForwardMode",
        "sglang/srt/model_executor/forward_batch_info.py",
    ),
    "minisgl.model_executor.forward_batch_info.ForwardMode.is_decode": (
        "ForwardMode.is_decode",
        "sglang/srt/model_executor/forward_batch_info.py",
    ),
    "minisgl.model_executor.forward_batch_info.ForwardMode.is_extend": (
        "ForwardMode.is_extend",
        "sglang/srt/model_executor/forward_batch_info.py",
    ),
    "minisgl.model_executor.forward_batch_info.clamp_position": (
        "_clamp_position_native",
        "sglang/srt/model_executor/forward_batch_info.py",
    ),
    "minisgl.model_executor.forward_batch_info.compute_position": (
        "compute_position",
        "sglang/srt/model_executor/forward_batch_info.py",
    ),
    "minisgl.model_executor.model_runner.ModelRunner": ("ModelRunner", "sglang/srt/model_executor/model_runner.py"),
    "minisgl.model_executor.model_runner.ModelRunner.__init__": (
        "ModelRunner.__init__",
        "sglang/srt/model_executor/model_runner.py",
    ),
    "minisgl.model_executor.model_runner.ModelRunner.forward": (
        "ModelRunner.forward",
        "sglang/srt/model_executor/model_runner.py",
    ),
    "minisgl.model_executor.model_runner.ModelRunner.init_memory_pool": (
        "ModelRunnerKVCacheMixin.init_memory_pool",
        "sglang/srt/model_executor/model_runner_kv_cache_mixin.py",
    ),
    "minisgl.model_executor.model_runner.ModelRunner.load_model": (
        "ModelRunner.load_model",
        "sglang/srt/model_executor/model_runner.py",
    ),
    "minisgl.model_executor.model_runner.ModelRunner.profile_max_num_token": (
        "ModelRunnerKVCacheMixin._profile_available_bytes",
        "sglang/srt/model_executor/model_runner_kv_cache_mixin.py",
    ),
    "minisgl.model_executor.model_runner.ModelRunner.sample": (
        "ModelRunner.sample",
        "sglang/srt/model_executor/model_runner.py",
    ),
    "minisgl.model_executor.model_runner.ModelRunnerOutput": (
        "ModelRunnerOutput",
        "sglang/srt/model_executor/model_runner.py",
    ),
    "minisgl.model_loader.loader.get_model": ("get_model", "sglang/srt/model_loader/__init__.py"),
    "minisgl.model_loader.loader.resolve_load_format": ("get_model_loader", "sglang/srt/model_loader/loader.py"),
    "minisgl.model_loader.loader.set_default_torch_dtype": (
        "set_default_torch_dtype",
        "sglang/srt/model_loader/utils.py",
    ),
    "minisgl.model_loader.weight_utils._gguf_to_hf_name": (
        "GGUFModelLoader._get_gguf_weights_map",
        "sglang/srt/model_loader/loader.py",
    ),
    "minisgl.model_loader.weight_utils.dummy_weights_iterator": (
        "initialize_dummy_weights",
        "sglang/srt/model_loader/weight_utils.py",
    ),
    "minisgl.model_loader.weight_utils.gguf_quant_weights_iterator": (
        "gguf_quant_weights_iterator",
        "sglang/srt/model_loader/weight_utils.py",
    ),
    "minisgl.model_loader.weight_utils.safetensors_weights_iterator": (
        "safetensors_weights_iterator",
        "sglang/srt/model_loader/weight_utils.py",
    ),
    "minisgl.models.llama.LlamaAttention": ("LlamaAttention", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaAttention.__init__": ("LlamaAttention.__init__", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaAttention.forward": ("LlamaAttention.forward", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaDecoderLayer": ("LlamaDecoderLayer", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaDecoderLayer.__init__": ("LlamaDecoderLayer.__init__", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaDecoderLayer.forward": ("LlamaDecoderLayer.forward", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaForCausalLM": ("LlamaForCausalLM", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaForCausalLM.__init__": ("LlamaForCausalLM.__init__", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaForCausalLM.forward": ("LlamaForCausalLM.forward", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaForCausalLM.load_weights": (
        "LlamaForCausalLM.load_weights",
        "sglang/srt/models/llama.py",
    ),
    "minisgl.models.llama.LlamaMLP": ("LlamaMLP", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaMLP.__init__": ("LlamaMLP.__init__", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaMLP.forward": ("LlamaMLP.forward", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaModel": ("LlamaModel", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaModel.__init__": ("LlamaModel.__init__", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.LlamaModel.forward": ("LlamaModel.forward", "sglang/srt/models/llama.py"),
    "minisgl.models.llama.MistralForCausalLM": ("MistralForCausalLM", "sglang/srt/models/mistral.py"),
    "minisgl.models.llama.MistralForCausalLM.__init__": ("MistralForCausalLM", "sglang/srt/models/mistral.py"),
    "minisgl.models.qwen2.Qwen2ForCausalLM": ("Qwen2ForCausalLM", "sglang/srt/models/qwen2.py"),
    "minisgl.models.qwen3.Qwen3Attention": ("Qwen3Attention", "sglang/srt/models/qwen3.py"),
    "minisgl.models.qwen3.Qwen3Attention.__init__": ("Qwen3Attention.__init__", "sglang/srt/models/qwen3.py"),
    "minisgl.models.qwen3.Qwen3Attention.apply_qk_norm": ("apply_qk_norm", "sglang/srt/models/utils.py"),
    "minisgl.models.qwen3.Qwen3DecoderLayer": ("Qwen3DecoderLayer", "sglang/srt/models/qwen3.py"),
    "minisgl.models.qwen3.Qwen3ForCausalLM": ("Qwen3ForCausalLM", "sglang/srt/models/qwen3.py"),
    "minisgl.models.qwen3.Qwen3Model": ("Qwen3Model", "sglang/srt/models/qwen3.py"),
    "minisgl.models.registry.get_model_class": ("_ModelRegistry.resolve_model_cls", "sglang/srt/models/registry.py"),
    "minisgl.sampling.sampling_batch_info.SamplingBatchInfo": (
        "SamplingBatchInfo",
        "sglang/srt/sampling/sampling_batch_info.py",
    ),
    "minisgl.sampling.sampling_batch_info.SamplingBatchInfo.from_schedule_batch": (
        "SamplingBatchInfo.from_schedule_batch",
        "sglang/srt/sampling/sampling_batch_info.py",
    ),
    "minisgl.sampling.sampling_params.SamplingParams": ("SamplingParams", "sglang/srt/sampling/sampling_params.py"),
    "minisgl.sampling.sampling_params.SamplingParams.__init__": (
        "SamplingParams.__init__",
        "sglang/srt/sampling/sampling_params.py",
    ),
    "minisgl.server_args.ServerArgs": ("ServerArgs", "sglang/srt/server_args.py"),
    "minisgl.server_args.ServerArgs.add_cli_args": ("ServerArgs.add_cli_args", "sglang/srt/server_args.py"),
    "minisgl.server_args.ServerArgs.check": ("ServerArgs.check_server_args", "sglang/srt/server_args.py"),
    "minisgl.server_args.ServerArgs.from_cli_args": ("ServerArgs.from_cli_args", "sglang/srt/server_args.py"),
    "minisgl.tp_launcher.launch_tp": ("main", "sglang/bench_one_batch.py"),
    "minisgl.utils.common.get_available_memory": ("get_available_gpu_memory", "sglang/srt/utils/common.py"),
    "minisgl.utils.common.synchronize": ("synchronize", "sglang/bench_one_batch.py"),
    "minisgl.utils.hf_transformers_utils.get_config": ("get_config", "sglang/srt/utils/hf_transformers/config.py"),
    "minisgl.utils.hf_transformers_utils.get_tokenizer": (
        "get_tokenizer",
        "sglang/srt/utils/hf_transformers/tokenizer.py",
    ),
    "minisgl.utils.profile_utils.create_torch_profiler_filename": (
        "_create_torch_profiler_filename",
        "sglang/bench_one_batch.py",
    ),
    "minisgl.utils.profile_utils.get_torch_profiler_output_dir": (
        "_get_torch_profiler_output_dir",
        "sglang/bench_one_batch.py",
    ),
    "minisgl.utils.profile_utils.start_profile": ("start_profile", "sglang/bench_one_batch.py"),
    "minisgl.utils.profile_utils.stop_profile": ("stop_profile", "sglang/bench_one_batch.py"),
}

# Pieces with no counterpart, and why. A key may name a module: it covers everything inside.
NO_COUNTERPART: dict[str, str] = {
    "minisgl.model_executor.runner.decode_cuda_graph_runner.get_seq_lens_to_capture": "SGLang's decode graphs bake in no sequence length (FlashInfer/Triton read lengths from kv_indptr in static buffers); minisgl's gathered decode fixes a padded length per graph",
    "minisgl.model_executor.runner.decode_cuda_graph_runner.uses_cuda_graphs": "SGLang decides inline in ModelRunner.init_decode_cuda_graph (check_cuda_graph_backend, and CPU graphs only with torch.compile)",
    "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend._workspace": "SGLang's torch-native backend gathers into fresh tensors; its GPU backends never gather",
    "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend._gather": "SGLang's torch-native backend indexes k_cache[per_req_tokens] inline, one request at a time",
    "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend._gather_kv": "as _gather; SGLang's CPU backend (intel_amx) reads K/V by slot inside its C++ decode kernel instead",
    "minisgl.layers.rotary_embedding._new_rope": "helper of get_rope; SGLang builds each rope variant in its factory",
    "minisgl.bench_args._check_writable_file": "helper of check_args",
    "minisgl.bench_args.check_args": "SGLang asserts inside the bench and validates ServerArgs in __post_init__; minisgl refuses every bad value before loading, with exit code 2",
    "minisgl.bench_one_batch._check_prompt_lengths": "SGLang only asserts len(prompt) > cut_len; minisgl refuses prompts that overflow the context",
    "minisgl.bench_one_batch._make_req": "SGLang repeats this Req set-up inline in each prepare_* function",
    "minisgl.bench_one_batch.cli": "SGLang's __main__ block; minisgl adds one-line errors and exit codes",
    "minisgl.bench_one_batch.parse_args": "SGLang parses in its __main__ block",
    "minisgl.bench_one_batch.work": "SGLang's main picks correctness_test or latency_test inline",
    "minisgl.bench_plot": "SGLang's bench writes results only; the chart is minisgl's",
    "minisgl.bench_utils": "SGLang's bench prints plain lines; rich progress, the summary table and whole-record appends are minisgl's",
    "minisgl.layers.attention.torch_native_backend.DecodeMetadata": "as ExtendMetadata",
    "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.decode_metadata": "as ExtendMetadata",
    "minisgl.layers.attention.cpu_decode.decode_attention_op": "SGLang's intel_amx backend calls torch.ops.sgl_kernel.decode_attention_cpu from its prebuilt wheel; minisgl answers its own op where cpu_kernels built it, else None (gather + SDPA)",
    "minisgl.layers.cpu_kernels": "SGLang's sgl_kernel ships its CPU kernels prebuilt in a wheel (sgl-kernel/setup_cpu.py); minisgl builds its C++ kernels (decode attention, the decode linear, RMSNorm, SiluAndMul, RoPE) at first use (torch.utils.cpp_extension) and keeps its aten paths where they cannot be built",
    "minisgl.layers.attention.cpu_decode.uses_decode_kernel": "SGLang runs its CPU kernels when --attention-backend is intel_amx; minisgl runs its decode kernel for every eager CPU decode where it is built",
    "minisgl.layers.attention.cpu_prefill.uses_prefill_kernel": "SGLang runs its CPU kernels when --attention-backend is intel_amx; minisgl runs its prefill kernel for every CPU extend with nothing cached where it is built and fits (no AMX, head_dim in blocks of 64, up to 4096 tokens)",
    "minisgl.layers.attention.cpu_prefill.prefill_kernel_built": "SGLang's kernels come prebuilt in sgl_kernel's wheel; minisgl asks cpu_kernels whether it built them, as a constant a compiled graph does not trace into",
    "minisgl.layers.attention.tiled_prefill.prefers_tiles": "SGLang's CPU extend always runs its one C++ kernel; minisgl picks tiles or SDPA per extend, by CPU, dtype and size",
    "minisgl.layers.attention.tiled_prefill._causal_bias": "helper of causal_prefill_attention; SGLang's C++ extend kernel masks inside its loops",
    "minisgl.layers.attention.torch_native_backend.ExtendMetadata": "SGLang's torch-native backend keeps no metadata; its Triton/FlashInfer backends build kv_indptr/kv_indices in init_forward_metadata",
    "minisgl.layers.linear._new_param": "SGLang creates parameters through quantization methods (create_weights)",
    "minisgl.layers.linear.copy_checked": "SGLang asserts shapes inside each weight_loader",
    "minisgl.layers.linear.shard": "SGLang narrows inside each weight_loader",
    "minisgl.layers.amx_utils.blocked_linear_is_faster": "SGLang's CPU path always packs for its AMX kernels (amx_utils); minisgl probes whether its C++ kernel reads a decode's few rows faster than oneDNN's packed kernel",
    "minisgl.layers.amx_utils.single_row_prefetch_bytes": "sgl-kernel's CPU GEMM (gemm.cpp, tinygemm_kernel_nn) fixes its prefetch distance at compile time, PREFETCH_SIZE_K = 0 (none), and packs weights into plain at::empty memory; minisgl probes its C++ kernel's single-row distance at load (Xeon and AMD EPYC differ) and puts the copies on huge pages",
    "minisgl.layers.amx_utils.blocked_copies": "what bench/perf.py records of blocked_linear_is_faster; SGLang's CPU kernel choice is cpu_has_amx_support() alone",
    "minisgl.layers.amx_utils.mkl_gemm_is_faster": "SGLang's CPU path always packs for its AMX kernels (amx_utils), else F.linear on the plain weight; minisgl probes whether MKL's GEMM on the plain weight beats oneDNN's packed kernel on a long prefill's rows",
    "minisgl.layers.amx_utils._mkl_gemm_probe": "the timing behind mkl_gemm_is_faster",
    "minisgl.layers.amx_utils.traced_gemm_on_plain_weight": "SGLang's compiled CPU graphs run the kernel UnquantizedLinearMethod.apply picked at load (sgl_kernel's weight_packed_linear with AMX, else F.linear, which Inductor may repack); minisgl keeps MKL's GEMM for a compiled long prefill where the probe finds it faster",
    "minisgl.layers.amx_utils.plain_weight_linear": "SGLang's CPUGraphRunner registers fakes for sgl_kernel ops (weight_packed_linear among them) so compiled graphs call them as they are; minisgl wraps F.linear on the plain weight likewise, to keep Inductor's freezing from packing it for oneDNN",
    "minisgl.layers.amx_utils.keep_gemm_copy": "SGLang keeps one weight per linear on CPU; minisgl keeps the plain float32 weight beside the packed one for long prefills where the probe finds MKL faster",
    "minisgl.layers.linear.keep_blocked_copies": "SGLang packs a compiled model's CPU weights at load as an eager one's (process_weights_after_loading); minisgl's compiled models keep plain weights for Inductor's freezing and only the C++ kernel's blocked copies",
    "minisgl.layers.amx_utils.keep_blocked_copy": "SGLang keeps one packed weight per linear on CPU (convert_weight_packed, AMX only); minisgl adds a column-blocked copy for its C++ kernel at a decode's few rows where the probe finds it faster",
    "minisgl.layers.amx_utils.keep_float32_copy": "SGLang packs CPU weights only where cpu_has_amx_support() (amx_process_weight_after_loading) and otherwise leaves bfloat16 to F.linear (torch's generic kernel on an AVX2-only CPU); minisgl keeps float32 copies on CPUs without bfloat16 arithmetic",
    "minisgl.layers.amx_utils.linear_in_float32": "the product over keep_float32_copy's copy; SGLang's CPU linears call sgl_kernel's weight_packed_linear (AMX) or F.linear",
    "minisgl.layers.amx_utils.multiplies_in_float32": "the rule behind keep_float32_copy; SGLang's CPU kernel choice is cpu_has_amx_support() alone",
    "minisgl.layers.amx_utils.min_packed_rows": "SGLang's CPU path packs for its AMX kernels and never pads rows; minisgl probes, on first use, whether oneDNN's 4-row kernel is faster",
    "minisgl.layers.amx_utils._packed_rows_probe": "the padding probe behind min_packed_rows",
    "minisgl.layers.amx_utils._probe_weights": "helper of the kernel probes",
    "minisgl.model_executor.cpu_graph_runner.tunes_small_decodes": "SGLang's CPUGraphRunner compiles every captured batch size alike (torch.compile, dynamic=False, no autotuning); minisgl autotunes small decodes where that measured faster",
    "minisgl.model_executor.cpu_graph_runner.profile_compiled_kernels": "SGLang 0.5.14 never sets Inductor's cpp.enable_kernel_profile, so its torch profiles show a compiled CPU graph as one call",
    "minisgl.model_executor.cpu_graph_runner.compile_options": "SGLang's patch_model calls torch.compile(torch.no_grad()(model.forward), dynamic=False) with no options, so dynamo checks all its guards",
    "minisgl.layers.amx_utils.alternating_seconds": "helper of the kernel probes and bench/decode_kernels.py",
    "minisgl.layers.amx_utils._is_faster_by_a_tenth": "the kernel probes' rule",
    "minisgl.layers.amx_utils.block_weight": "the layout of keep_blocked_copy's copy, as sgl_kernel's convert_weight_packed packs weights (VNNI, for AMX) for weight_packed_linear",
    "minisgl.layers.amx_utils.blocked_linear": "the product over keep_blocked_copy's copy, minisgl's C++ kernel (csrc/gemm.cpp); SGLang's CPU linears call sgl_kernel's weight_packed_linear (AVX-512/AMX, not in SGLang's Python source)",
    "minisgl.mem_cache.common.OutOfKVCacheError": "SGLang raises RuntimeError('Out of memory...') after trying to evict from the tree cache",
    "minisgl.model_loader.default_model": "SGLang requires --model-path; minisgl ships a default offline model",
    "minisgl.model_loader.weight_utils._unpermute_rope": "SGLang's GGUF path relies on transformers/gguf for the q/k permutation",
    "minisgl.models.llama.LlamaAttention.apply_qk_norm": "a hook for Qwen3; Llama has no q/k norm",
    "minisgl.models.llama.LlamaForCausalLM.qkv_bias": "SGLang reads config.attention_bias inline in LlamaAttention",
    "minisgl.models.qwen2.Qwen2ForCausalLM.qkv_bias": "SGLang's Qwen2Attention passes bias=True inline",
    "minisgl.server_args._Refuse": "SGLang accepts all its flags; minisgl refuses those it lacks by name",
    "minisgl.tp_launcher": "private helpers of launch_tp (SGLang uses multiprocessing.Process and kill_process_tree)",
    "minisgl.utils.common.InputError": "SGLang raises ValueError/assertions; minisgl turns bad input into exit code 2",
    "minisgl.utils.common.resolve_device": "SGLang resolves the device in ServerArgs",
    "minisgl.utils.common.keep_freed_cpu_memory": "SGLang's CPU guide preloads tcmalloc or TBB's malloc (LD_PRELOAD) instead of tuning glibc's",
    "minisgl.utils.common.cache_dir": "minisgl's own download cache; SGLang relies on the HF hub's",
    "minisgl.utils.hf_transformers_utils.split_model_path": "SGLang's GGUF detection lives in ServerArgs and get_config",
    "minisgl.utils.hf_transformers_utils.gguf_metadata_dir": "SGLang parses a GGUF's metadata each time it is asked",
    "minisgl.utils.hf_transformers_utils._load_cached": "helper of gguf_metadata_dir's cache; SGLang has none",
}
