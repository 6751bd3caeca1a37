// A linear layer's product for the few rows of a decode step, x @ W^T (+ bias), over a column-blocked copy of W.
// Built with decode.cpp by cpu_kernels.py; amx_utils.py keeps the copy and calls it where a probe finds it faster.
//
// SGLang's counterpart is sgl-kernel's weight_packed_linear (sgl-kernel/csrc/cpu/gemm.cpp), with its
// convert_weight_packed: AVX-512 and AMX tiles over VNNI-packed bfloat16/fp8/int8 weights, for any row count.
//
// A decode step's linears are a weight read: each weight element is used once per row, and there are 1-16 rows.
// So the layout is made for reading: the weight is cut into blocks of kCols output features (two vectors), each
// block stored [K, kCols], so that on AVX2 one k is one float32 cache line (half a bfloat16 one), and a thread
// reads its blocks front to back. Each row's kCols sums stay in registers across a tile of 128 ks (carried from
// tile to tile in L1); rows go four at a time (8 accumulators: half of AVX2's 16 vector registers). On CPUs with
// AVX512-BF16, bfloat16 copies are stored in pairs of ks for its dot-product instruction instead (pair_row_group).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef __linux__
#include <sys/mman.h>
#endif
#if defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif

namespace {

using Vec = at::vec::Vectorized<float>;
using BVec = at::vec::Vectorized<c10::BFloat16>;
constexpr int64_t kVec = Vec::size();
constexpr int64_t kCols = 2 * kVec;  // output features per block: one bfloat16 vector, two float32 ones
static_assert(BVec::size() == kCols, "a bfloat16 vector must widen to exactly two float32 vectors");
constexpr int64_t kRows = 4;         // rows whose sums share a pass over the weights
constexpr int64_t kChunkRows = 16;   // rows whose partial sums a block keeps at a time
// Ks per tile: the later row groups read the tile again from L1 (kTileK * kCols floats, 8 KiB on AVX2).
constexpr int64_t kTileK = 128;
// How far ahead of its reads the streaming row group asks for weights, into L2 (prefetcht1). The hardware
// prefetchers alone left a Xeon (Sapphire Rapids, AVX-512) core waiting: SmolLM2's linears, float32, GB/s without
// -> with, alternated: 1 row 17.4 -> 19.2, 4 rows 10.4 -> 16.5, 8 rows 10.1 -> 14.4, 16 rows 7.2 -> 9.2; 8 and 32 KiB
// ahead read alike, 64 a little slower, and prefetchnta (no L2 copy) was slower than none.
constexpr int64_t kPrefetchBytes = 16 * 1024;
// A single row's distance is set at load by a probe (amx_utils.single_row_prefetch_bytes): one row consumes its
// stream fastest, and on an AMD EPYC Zen 4 VM 16 KiB ahead was the slowest distance for it, where several rows
// read best at 16 as on the Xeon. SmolLM2's linears and head, one row, ms per step, alternated, medians: in the
// VM's fast phase (a 1 GiB sum at 52-62 GB/s, 53 rounds) 16 KiB 13.31, 4 KiB 12.54, none 12.20; in its slow phase
// (30-34 GB/s, 7 rounds) 17.75, 18.50, 17.91.
int64_t single_row_prefetch_bytes = kPrefetchBytes;
// Whether threads done with their own blocks claim the others' (below); off only to measure what it buys
// (bench/decode_kernels.py --levers).
bool work_sharing = true;

// Asks for the cache lines of `ks` ks of a block's weights, `ahead` bytes past `w`. Blocks lie one after another,
// so past a block's last k this is the next block's first: the thread's one stream, front to back.
template <typename W>
__attribute__((always_inline)) inline void prefetch_ahead(const W* w, int64_t ks, int64_t ahead) {
  const char* next = reinterpret_cast<const char*>(w) + ahead;
  for (int64_t byte = 0; byte < ks * kCols * static_cast<int64_t>(sizeof(W)); byte += 64)
    __builtin_prefetch(next + byte, 0, 2);
}

template <typename W>
inline void load_cols(const W* w, Vec& lo, Vec& hi) {
  if constexpr (std::is_same_v<W, float>) {
    lo = Vec::loadu(w);
    hi = Vec::loadu(w + kVec);
  } else {
    std::tie(lo, hi) = at::vec::convert_bfloat16_float(BVec::loadu(w));  // bfloat16 -> float32 is a shift
  }
}

// ROWS rows of x (row stride K, from the tile's first k) times a tile of n ks of one block (w); the sums start at
// zero (the first tile) or at `sums`. `prefetch`: how far ahead the group that reads the tile from memory (the
// first) prefetches; 0 for the others, which find it in L1, and where the probe found no prefetch the fastest.
// Forced inline: compiled as a call, the accumulators went to memory and 8 rows took 1.8x the time.
template <int ROWS, typename W>
__attribute__((always_inline)) inline void
row_group(const float* x, int64_t K, const W* w, int64_t n, float* sums, bool first, int64_t prefetch) {
  Vec acc[ROWS][2];
  for (int r = 0; r < ROWS; ++r) {
    acc[r][0] = first ? Vec(0.f) : Vec::loadu(sums + r * kCols);
    acc[r][1] = first ? Vec(0.f) : Vec::loadu(sums + r * kCols + kVec);
  }
  int64_t k = 0;
  if constexpr (ROWS <= 2) {
    // Few rows are few accumulators, each waiting on its last FMA: a second set, for odd ks, halves that wait.
    Vec odd[ROWS][2];
    for (int r = 0; r < ROWS; ++r) odd[r][0] = odd[r][1] = Vec(0.f);
    for (; k + 1 < n; k += 2) {
      Vec w0, w1, v0, v1;
      if (prefetch) prefetch_ahead(w + k * kCols, 2, prefetch);
      load_cols(w + k * kCols, w0, w1);
      load_cols(w + (k + 1) * kCols, v0, v1);
      for (int r = 0; r < ROWS; ++r) {
        const Vec xe(x[r * K + k]), xo(x[r * K + k + 1]);
        acc[r][0] = at::vec::fmadd(xe, w0, acc[r][0]);
        acc[r][1] = at::vec::fmadd(xe, w1, acc[r][1]);
        odd[r][0] = at::vec::fmadd(xo, v0, odd[r][0]);
        odd[r][1] = at::vec::fmadd(xo, v1, odd[r][1]);
      }
    }
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][0] + odd[r][0], acc[r][1] = acc[r][1] + odd[r][1];
  }
  for (; k < n; ++k) {
    Vec w0, w1;
    if (prefetch) prefetch_ahead(w + k * kCols, 1, prefetch);
    load_cols(w + k * kCols, w0, w1);
    for (int r = 0; r < ROWS; ++r) {
      const Vec xr(x[r * K + k]);
      acc[r][0] = at::vec::fmadd(xr, w0, acc[r][0]);
      acc[r][1] = at::vec::fmadd(xr, w1, acc[r][1]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    acc[r][0].store(sums + r * kCols);
    acc[r][1].store(sums + r * kCols + kVec);
  }
}

template <typename W>
__attribute__((always_inline)) inline void
row_groups(const float* x, int64_t rows, int64_t K, const W* w, int64_t n, float* sums, bool first, int64_t prefetch) {
  for (int64_t m = 0; m < rows; m += kRows) {
    const float* xm = x + m * K;
    float* sm = sums + m * kCols;
    switch (std::min(kRows, rows - m)) {
      case 4: row_group<4>(xm, K, w, n, sm, first, m == 0 ? prefetch : 0); break;
      case 3: row_group<3>(xm, K, w, n, sm, first, m == 0 ? prefetch : 0); break;
      case 2: row_group<2>(xm, K, w, n, sm, first, m == 0 ? prefetch : 0); break;
      default: row_group<1>(xm, K, w, n, sm, first, m == 0 ? prefetch : 0); break;
    }
  }
}

// One block's tile of ks for `rows` rows. Bfloat16 weights read by several row groups are widened once, into L1.
template <typename W>
inline void block_tile(const float* x, int64_t rows, int64_t K, const W* block, int64_t k0, int64_t k1, float* sums,
                       int64_t prefetch) {
  const W* tile = block + k0 * kCols;
  const int64_t n = k1 - k0;
  if (std::is_same_v<W, float> || rows <= kRows) return row_groups(x + k0, rows, K, tile, n, sums, k0 == 0, prefetch);
  alignas(64) float wide[kTileK * kCols];
  for (int64_t i = 0; i < n * kCols; i += kCols) {
    prefetch_ahead(tile + i, 1, kPrefetchBytes);
    Vec lo, hi;
    load_cols(tile + i, lo, hi);
    lo.store(wide + i);
    hi.store(wide + i + kVec);
  }
  row_groups<float>(x + k0, rows, K, wide, n, sums, k0 == 0, 0);
}

#if defined(CPU_CAPABILITY_AVX512)
// Bfloat16 copies on CPUs with AVX512-BF16 are stored pair by pair of ks: [blocks, K / 2, kCols, 2], so that one
// 32-bit lane holds a feature's weights at ks 2p and 2p + 1, as vdpbf16ps reads them: one instruction multiplies a
// pair of bfloat16 inputs by 16 features' pairs and adds both products to float32 sums (exact products, float32
// sums, as the widening path, but denormals flushed to zero), where the widening path spends a shift and two FMAs. Several rows are then no longer
// bound by the FMAs. The linears and head of a model's shape, bfloat16, ms, widened -> pairs (oneDNN's packed kernel),
// alternated, medians of 13 rounds, AMD EPYC Zen 4 VM in its slow phase: SmolLM2 1 row 13.2 -> 12.1 (20.4), 8 rows
// 19.2 -> 13.3 (19.4), 16 rows 33.7 -> 18.7 (27.0); dummy134 1 row 9.0 -> 8.6 (13.5), 8 rows 14.6 -> 9.4 (12.2).
// sgl-kernel's pack_vnni stores its bfloat16 weights in the same pairs ([K/2, N, 2]) for its AVX-512 and AMX paths.
#define PAIRS_TARGET __attribute__((target("avx512bf16"), always_inline)) inline

// ROWS rows times a tile of `pairs` pairs of ks of one block (w: two vectors per pair), the sums as row_group's.
// Bfloat16 rows are read as 32-bit pairs (x_stride in pairs); float32 rows (x_stride in floats) multiply the
// weights widened to float32, the low half of a lane being its even k.
template <int ROWS, bool kBfloat16Rows>
PAIRS_TARGET void pair_row_group(const void* x, int64_t x_stride, const __m512i* w, int64_t pairs, float* sums,
                                 bool first, int64_t prefetch) {
  __m512 acc[ROWS][2];
  for (int r = 0; r < ROWS; ++r) {
    acc[r][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(sums + r * kCols);
    acc[r][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(sums + r * kCols + kVec);
  }
  const __m512i high_half = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t p = 0; p < pairs; ++p) {
    if (prefetch) prefetch_ahead(reinterpret_cast<const c10::BFloat16*>(w + 2 * p), 2, prefetch);
    const __m512i w0 = _mm512_loadu_si512(w + 2 * p), w1 = _mm512_loadu_si512(w + 2 * p + 1);
    for (int r = 0; r < ROWS; ++r) {
      if constexpr (kBfloat16Rows) {
        const __m512i xr = _mm512_set1_epi32(static_cast<const int32_t*>(x)[r * x_stride + p]);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)xr, (__m512bh)w0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)xr, (__m512bh)w1);
      } else {
        const float* xr = static_cast<const float*>(x) + r * x_stride + 2 * p;
        const __m512 even = _mm512_set1_ps(xr[0]), odd = _mm512_set1_ps(xr[1]);
        acc[r][0] = _mm512_fmadd_ps(even, _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)), acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(even, _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)), acc[r][1]);
        acc[r][0] = _mm512_fmadd_ps(odd, _mm512_castsi512_ps(_mm512_and_si512(w0, high_half)), acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(odd, _mm512_castsi512_ps(_mm512_and_si512(w1, high_half)), acc[r][1]);
      }
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    _mm512_storeu_ps(sums + r * kCols, acc[r][0]);
    _mm512_storeu_ps(sums + r * kCols + kVec, acc[r][1]);
  }
}

// One block's tile of pairs [p0, p1) for `rows` rows, four at a time; later groups find the tile in L1.
template <bool kBfloat16Rows>
__attribute__((target("avx512bf16"))) void pair_tile(const void* x, int64_t rows, int64_t x_stride,
                                                     const __m512i* block, int64_t p0, int64_t p1, float* sums,
                                                     int64_t prefetch) {
  using X = std::conditional_t<kBfloat16Rows, int32_t, float>;
  const X* x0 = static_cast<const X*>(x) + (kBfloat16Rows ? p0 : 2 * p0);
  const __m512i* tile = block + 2 * p0;
  for (int64_t m = 0; m < rows; m += kRows) {
    const X* xm = x0 + m * x_stride;
    float* sm = sums + m * kCols;
    const bool first = p0 == 0;
    const int64_t ahead = m == 0 ? prefetch : 0;
    switch (std::min(kRows, rows - m)) {
      case 4: pair_row_group<4, kBfloat16Rows>(xm, x_stride, tile, p1 - p0, sm, first, ahead); break;
      case 3: pair_row_group<3, kBfloat16Rows>(xm, x_stride, tile, p1 - p0, sm, first, ahead); break;
      case 2: pair_row_group<2, kBfloat16Rows>(xm, x_stride, tile, p1 - p0, sm, first, ahead); break;
      default: pair_row_group<1, kBfloat16Rows>(xm, x_stride, tile, p1 - p0, sm, first, ahead); break;
    }
  }
}
#endif

// Whether bfloat16 copies are made in pairs (above): built for AVX-512 and run on a CPU with AVX512-BF16.
bool pairs_supported() {
#if defined(CPU_CAPABILITY_AVX512)
  static const bool supported = __builtin_cpu_supports("avx512bf16") != 0;
  return supported;
#else
  return false;
#endif
}
// Whether block_weight makes pair copies where supported; off only to compare with the widening path.
bool bfloat16_pairs = true;

// out = x @ W^T + bias over the blocks of W's copy; tile(b, m0, rows, k0, k1, sums, prefetch) adds block b's ks
// [k0, k1) for rows [m0, m0 + rows) into sums (starting them at k0 == 0), in the copy's own layout.
template <typename T, typename Tile>
void blocked_linear_impl(int64_t M, int64_t K, const T* bias, int64_t N, T* out, const Tile& tile) {
  const int64_t blocks = (N + kCols - 1) / kCols;
  const int64_t prefetch = M == 1 ? single_row_prefetch_bytes : kPrefetchBytes;
  // Each thread owns a contiguous range of blocks, one forward stream of weights per core, and claims them one by
  // one; done with its own, it claims the next blocks of the others'. A static split ended each call when its
  // slower thread did, and a step's 121 calls (SmolLM2) are each too short for the threads' speeds to even out:
  // its linears at one row on an AMD EPYC Zen 4 VM, alternated, ms, medians of 40 rounds (fast phase) and 260
  // (slow): 12.16 -> 11.54, 17.98 -> 17.36; eight rows 20.51 -> 20.06, 22.77 -> 22.35.
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), blocks));
  const int64_t claimed_ranges = work_sharing ? threads : 1;  // its own range first, then the others' in turn
  std::vector<std::atomic<int64_t>> next_block(threads);
  std::vector<int64_t> range_end(threads);
  for (int64_t t = 0; t < threads; ++t) {
    next_block[t].store(blocks * t / threads, std::memory_order_relaxed);
    range_end[t] = blocks * (t + 1) / threads;
  }
  auto run_block = [&](int64_t b, float* sums) {
    const int64_t cols = std::min(kCols, N - b * kCols);
    for (int64_t m0 = 0; m0 < M; m0 += kChunkRows) {
      const int64_t rows = std::min(kChunkRows, M - m0);
      // k0 == 0 runs once even where K is 0, so that the sums start at zero
      for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += kTileK)
        tile(b, m0, rows, k0, std::min(K, k0 + kTileK), sums, prefetch);
      for (int64_t r = 0; r < rows; ++r) {
        T* out_row = out + (m0 + r) * N + b * kCols;
        for (int64_t c = 0; c < cols; ++c) {
          const float bias_c = bias ? static_cast<float>(bias[b * kCols + c]) : 0.f;
          out_row[c] = static_cast<T>(sums[r * kCols + c] + bias_c);
        }
      }
    }
  };
  // One index per thread; where the pool runs fewer (a nested call), one thread's turn claims every range in turn.
  at::parallel_for(0, threads, 1, [&](int64_t first, int64_t last) {
    alignas(64) float sums[kChunkRows * kCols];
    for (int64_t t = first; t < last; ++t)
      for (int64_t i = 0; i < claimed_ranges; ++i) {
        const int64_t owner = (t + i) % threads;
        for (int64_t b; (b = next_block[owner].fetch_add(1, std::memory_order_relaxed)) < range_end[owner];)
          run_block(b, sums);
      }
  });
}

// An empty tensor whose memory the kernel may back with 2 MiB pages (Linux's transparent huge pages, where they
// are on "madvise", as on these VMs, or "always"), elsewhere a plain one. A step streams every weight once: with 4
// KiB pages that is a TLB miss every 4 KiB (131k for SmolLM2's 538 MB), with 2 MiB pages one per 2 MiB. The same
// alternated runs as for the prefetch distance, 4 KiB pages -> huge pages: 4 KiB ahead 12.54 -> 11.58 (fast phase),
// 18.50 -> 17.35 (slow); 16 KiB ahead 13.31 -> 13.19, 17.75 -> 17.12.
at::Tensor huge_page_empty(const std::vector<int64_t>& sizes, const at::TensorOptions& options) {
#ifdef MADV_HUGEPAGE
  int64_t elements = 1;
  for (int64_t size : sizes) elements *= size;
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t bytes = static_cast<size_t>(elements) * options.dtype().itemsize();
  const size_t length = bytes + kHugePage;  // room to start on a 2 MiB boundary: only aligned pages can be huge
  void* base = bytes >= kHugePage ? mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                                  : MAP_FAILED;  // smaller copies hold no whole huge page: plain memory
  if (base != MAP_FAILED) {
    const auto start = (reinterpret_cast<uintptr_t>(base) + kHugePage - 1) & ~(kHugePage - 1);
    madvise(reinterpret_cast<void*>(start), bytes, MADV_HUGEPAGE);  // advice: where refused, 4 KiB pages stay
    return at::from_blob(reinterpret_cast<void*>(start), sizes, [base, length](void*) { munmap(base, length); },
                         options);
  }
#endif
  return at::empty(sizes, options);
}

// [N, K] -> [ceil(N / kCols), K, kCols], the last block's missing features zero; a bfloat16 weight of an even K where
// pairs are supported (and on) -> [ceil(N / kCols), K / 2, kCols, 2].
at::Tensor block_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "block_weight: weight must be [out, in], got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16,
              "block_weight: float32 or bfloat16 weights only, got ", weight.scalar_type());
  const int64_t N = weight.size(0), K = weight.size(1), blocks = (N + kCols - 1) / kCols;
  const bool pairs = weight.scalar_type() == at::kBFloat16 && K % 2 == 0 && bfloat16_pairs && pairs_supported();
  auto padded = at::zeros({blocks * kCols, K}, weight.options());
  padded.narrow(0, 0, N).copy_(weight);
  if (pairs) {
    auto blocked = huge_page_empty({blocks, K / 2, kCols, 2}, weight.options());
    return blocked.copy_(padded.view({blocks, kCols, K / 2, 2}).permute({0, 2, 1, 3}));
  }
  auto blocked = huge_page_empty({blocks, K, kCols}, weight.options());
  return blocked.copy_(padded.view({blocks, kCols, K}).transpose(1, 2));
}

// Sets how far ahead a single row's stream prefetches (0: not at all); returns the distance it replaces.
int64_t set_single_row_prefetch(int64_t bytes) {
  TORCH_CHECK(bytes >= 0 && bytes % 64 == 0, "set_single_row_prefetch: a non-negative multiple of 64 bytes, got ",
              bytes);
  return std::exchange(single_row_prefetch_bytes, bytes);
}

// Turns the work sharing on or off (off: each thread runs its own range, a static split); returns the setting it
// replaces.
bool set_work_sharing(bool on) { return std::exchange(work_sharing, on); }

// Sets whether block_weight makes bfloat16 copies in pairs where the CPU has AVX512-BF16 (on by default); returns
// the setting it replaces. Off only to compare the two paths (bench/decode_kernels.py --levers, the tests).
bool set_bfloat16_pairs(bool on) { return std::exchange(bfloat16_pairs, on); }

at::Tensor blocked_linear(const at::Tensor& x, const at::Tensor& blocked, const c10::optional<at::Tensor>& bias,
                          int64_t out_features) {
  TORCH_CHECK(x.dim() == 2, "blocked_linear: x must be [rows, in], got ", x.sizes());
  const bool pairs = blocked.dim() == 4;
  TORCH_CHECK((blocked.dim() == 3 || (pairs && blocked.size(3) == 2 && blocked.scalar_type() == at::kBFloat16 &&
                                      pairs_supported())) &&
                  blocked.size(2) == kCols && blocked.is_contiguous() &&
                  (blocked.scalar_type() == at::kFloat || blocked.scalar_type() == at::kBFloat16),
              "blocked_linear: the weight must come from block_weight");
  const int64_t M = x.size(0), K = x.size(1), weight_k = pairs ? 2 * blocked.size(1) : blocked.size(1);
  TORCH_CHECK(K == weight_k, "blocked_linear: x has ", K, " features, the weight ", weight_k);
  TORCH_CHECK(out_features > (blocked.size(0) - 1) * kCols && out_features <= blocked.size(0) * kCols,
              "blocked_linear: ", out_features, " output features do not fit ", blocked.size(0), " blocks");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "blocked_linear: float32 or bfloat16 inputs only");
  TORCH_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == out_features && bias->device().is_cpu()),
              "blocked_linear: the bias must be a CPU vector of ", out_features, " features");
  // A decode's few rows: converting them costs nothing. Pairs read bfloat16 rows as they are; every other path
  // reads float32 rows.
  const auto rows_dtype = pairs && x.scalar_type() == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
  const at::Tensor rows = x.to(rows_dtype).contiguous();
  auto out = at::empty({M, out_features}, x.options());
  const at::Tensor bias_cast = bias.has_value() ? bias->to(x.scalar_type()).contiguous() : at::Tensor();
  auto run = [&](auto* out_ptr) {
    using T = std::remove_pointer_t<decltype(out_ptr)>;
    const T* bias_ptr = bias_cast.defined() ? bias_cast.data_ptr<T>() : nullptr;
    const void* x_rows = rows.data_ptr();
    if (pairs) {
#if defined(CPU_CAPABILITY_AVX512)
      const auto* w = static_cast<const __m512i*>(blocked.data_ptr());
      const int64_t block_vectors = K * kCols * 2 / 64;  // a block's 64-byte vectors
      const bool bf16_rows = rows_dtype == at::kBFloat16;
      const int64_t x_stride = bf16_rows ? K / 2 : K;
      blocked_linear_impl(M, K, bias_ptr, out_features, out_ptr,
                          [&](int64_t b, int64_t m0, int64_t n, int64_t k0, int64_t k1, float* sums, int64_t ahead) {
                            const char* xm = static_cast<const char*>(x_rows) + m0 * K * rows.element_size();
                            if (bf16_rows)
                              pair_tile<true>(xm, n, x_stride, w + b * block_vectors, k0 / 2, k1 / 2, sums, ahead);
                            else
                              pair_tile<false>(xm, n, x_stride, w + b * block_vectors, k0 / 2, k1 / 2, sums, ahead);
                          });
#endif
      return;
    }
    const float* xf = static_cast<const float*>(x_rows);
    auto widened = [&](const auto* w) {
      blocked_linear_impl(M, K, bias_ptr, out_features, out_ptr,
                          [&](int64_t b, int64_t m0, int64_t n, int64_t k0, int64_t k1, float* sums, int64_t ahead) {
                            block_tile(xf + m0 * K, n, K, w + b * K * kCols, k0, k1, sums, ahead);
                          });
    };
    if (blocked.scalar_type() == at::kFloat)
      widened(blocked.data_ptr<float>());
    else
      widened(blocked.data_ptr<c10::BFloat16>());
  };
  if (x.scalar_type() == at::kFloat)
    run(out.data_ptr<float>());
  else
    run(out.data_ptr<c10::BFloat16>());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minisgl_cpu, m) {
  m.def("block_weight(Tensor weight) -> Tensor");
  m.def("blocked_linear(Tensor x, Tensor blocked, Tensor? bias, int out_features) -> Tensor");
  m.def("set_single_row_prefetch(int bytes) -> int", &set_single_row_prefetch);  // no tensor: every backend
  m.def("set_work_sharing(bool on) -> bool", &set_work_sharing);
  m.def("set_bfloat16_pairs(bool on) -> bool", &set_bfloat16_pairs);
}

TORCH_LIBRARY_IMPL(minisgl_cpu, CPU, m) {
  m.impl("block_weight", &block_weight);
  m.impl("blocked_linear", &blocked_linear);
}
