#!/usr/bin/env bash
# The CUDA checks of issue #5 in one run, for a lent GPU machine (the device tool's `run`):
#   1. tests/test_hf_equality.py with both engines on the GPU, and tests/test_cuda_graph.py's real graphs
#      (MINISGL_TEST_DEVICE=cuda);
#   2. bench/perf.py --device cuda: minisgl eager against HF on SmolLM2's shape and dummy134, both dtypes, every
#      workload, as results-cuda.json in $OUT (set by the device tool; else in $TMPDIR or /tmp), with both logs.
# A failing test does not stop the benchmark (a GPU's time is scarce): the script exits with the tests' status.
# That machine's python3 has torch with CUDA, transformers, safetensors, tokenizers and pytest, and no network: minisgl
# runs from this tree (PYTHONPATH), and SmolLM2's GGUF cannot be fetched there, so its random-weight shape stands in
# (same parameters, same timings, as bench/perf.py measured).
# ENGINES="minisgl compiled hf" adds --enable-torch-compile (a few minutes of compiles: on an H200, dummy134 alone with
# all three engines took 264 s against 150 s for both models eagerly; the run with --models dummy134 --output
# "$OUT/results-cuda-compiled.json" fits a 15-minute lease beside the eager one).
# Copy the JSON to bench/results-cuda.json (the others beside it as results-cuda-<what>.json) here and run
# `python -m reader site --build`: the results page shows each.
# Arguments go on to perf.py; a quick rehearsal without a GPU: DEVICE=cpu bash bench/cuda.sh --workloads 1,16,4 --reps 1
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-${TMPDIR:-/tmp}}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -c 'import torch, transformers; print("torch", torch.__version__, "CUDA", torch.version.cuda, "transformers",
      transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")'
device="${DEVICE:-cuda}"
tests=0
MINISGL_TEST_DEVICE="$device" python3 -m pytest -q -p no:cacheprovider tests/test_hf_equality.py tests/test_cuda_graph.py 2>&1 |
  tee "$out/tests-cuda.log" || tests=$?
# shellcheck disable=SC2086  # ENGINES is a list of words; keep hf in it, the results page compares against it
python3 bench/perf.py --device "$device" --models smollm2-shape dummy134 --engines ${ENGINES:-minisgl hf} --reps 3 \
  --output "$out/results-cuda.json" "$@" 2>&1 | tee "$out/perf-cuda.log"
exit "$tests"
