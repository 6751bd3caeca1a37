// Causal attention of prompts with nothing cached, on CPU: each request's queries against its own new keys and
// values, the extend of a prefill. Built with decode.cpp by cpu_kernels.py and called through cpu_prefill.py,
// vectorized with ATen's Vectorized<float> for the ISA TorchInductor picks. SGLang's counterpart, sgl-kernel's
// extend_attention_cpu (sgl-kernel/csrc/cpu/extend.cpp), also reads a cached prefix from the paged pool and
// multiplies 16-bit blocks with AVX-512-BF16 and AMX.
//
// The work is split into units of (request, KV head, block of at least kQueryBlock tokens). A unit's rows are its
// tokens' query heads that share the KV head (grouped-query attention reads each key once per group, not once per
// head), and its keys are the request's first tokens up to the block's last: the causal triangle is never computed
// past the block's diagonal. Each unit holds its scores whole (at most kMaxTokens keys), so one pass computes them,
// a second takes each row's softmax and a third sums the values: no running max to rescale, as in a flash kernel,
// whose blocks pay that for lengths that do not fit. The keys are transposed once per (request, KV head) for all
// its units, a few MB of pairs (a wave) at a time.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <type_traits>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kVec = Vec::size();
// Register blocks: kRows query rows against kKeyVecs vectors of keys (scores), or against kValueVecs vectors of
// head_dim (outputs). 4 x 2 and 4 x 4 accumulators, each FMA chain independent, fit AVX-512's 32 registers.
constexpr int64_t kRows = 4;
constexpr int64_t kKeyVecs = 2;
constexpr int64_t kValueVecs = 4;
constexpr int64_t kQueryBlock = 16;  // tokens per unit at least: 24 units for SmolLM2's 3 KV heads at 128 tokens
// Query rows per unit at least: with one query head per KV head, 48 tokens a unit, not 16, so that a unit's
// packing and softmax pay for more products (dummy134's heads, kernel alone, us: 8x128 1587-2374 -> 1263-1563).
constexpr int64_t kUnitRows = 48;
constexpr int64_t kMaxTokens = 4096;  // a unit's scores stay whole: its rows x kMaxTokens floats

inline std::unique_ptr<float[]> scratch(int64_t n) {
  return std::unique_ptr<float[]>(new float[std::max<int64_t>(n, 1)]);  // uninitialized: written before read
}

// scores[r][j, j + kKeyVecs * kVec) = q[r] . keys[j + i] for rows r < rows: q float [rows][head_dim], keys_t the
// block's keys transposed, [head_dim][kKeyVecs * kVec], so each key vector is a load and each query element a
// broadcast.
template <int64_t rows>
inline void score_block(const float* __restrict q, int64_t head_dim, const float* __restrict keys_t, int64_t j,
                        float* __restrict scores, int64_t score_stride) {
  Vec acc[rows][kKeyVecs];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kKeyVecs; ++c) acc[r][c] = Vec(0.f);
  for (int64_t d = 0; d < head_dim; ++d) {
    Vec keys[kKeyVecs];
    for (int64_t c = 0; c < kKeyVecs; ++c) keys[c] = Vec::loadu(keys_t + (d * kKeyVecs + c) * kVec);
    for (int64_t r = 0; r < rows; ++r) {
      const Vec qd(q[r * head_dim + d]);
      for (int64_t c = 0; c < kKeyVecs; ++c) acc[r][c] = at::vec::fmadd(qd, keys[c], acc[r][c]);
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kKeyVecs; ++c) acc[r][c].store(scores + r * score_stride + j + c * kVec);
}

// out[r][d0, d0 + kValueVecs * kVec) = sum over j < n of p[r][j] * values[j]: probabilities [rows][p_stride],
// values float [n][value_stride].
template <int64_t rows>
inline void value_block(const float* __restrict p, int64_t p_stride, const float* __restrict values,
                        int64_t value_stride, int64_t n, int64_t d0, float* __restrict out, int64_t out_stride) {
  Vec acc[rows][kValueVecs];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kValueVecs; ++c) acc[r][c] = Vec(0.f);
  for (int64_t j = 0; j < n; ++j) {
    Vec v[kValueVecs];
    for (int64_t c = 0; c < kValueVecs; ++c) v[c] = Vec::loadu(values + j * value_stride + d0 + c * kVec);
    for (int64_t r = 0; r < rows; ++r) {
      const Vec pj(p[r * p_stride + j]);
      for (int64_t c = 0; c < kValueVecs; ++c) acc[r][c] = at::vec::fmadd(pj, v[c], acc[r][c]);
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kValueVecs; ++c) acc[r][c].store(out + r * out_stride + d0 + c * kVec);
}

// Row r's softmax over its keys [0, limit) in place, its sum's inverse returned; keys [limit, padded) become 0, so
// that the value sum can run over a whole block of rows without a mask.
inline float softmax_row(float* s, int64_t limit, int64_t padded) {
  Vec max_vec(-INFINITY);
  int64_t j = 0;
  for (; j + kVec <= limit; j += kVec) max_vec = at::vec::maximum(max_vec, Vec::loadu(s + j));
  float max = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, max_vec);
  for (; j < limit; ++j) max = std::max(max, s[j]);
  const Vec shift(max);
  Vec sum_vec(0.f);
  for (j = 0; j + kVec <= limit; j += kVec) {
    const Vec w = (Vec::loadu(s + j) - shift).exp_u20();
    w.store(s + j);
    sum_vec = sum_vec + w;
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sum_vec);
  for (; j < limit; ++j) sum += (s[j] = std::exp(s[j] - max));
  std::fill(s + limit, s + padded, 0.f);
  return 1.f / sum;
}

constexpr int64_t kKeys = kKeyVecs * kVec;  // keys per score block
// The keys (and widened 16-bit values) of the (request, KV head) pairs attended at once: a wave's packed K/V stay in
// the caches while its units read them. Packed for the whole batch first (dummy134 bfloat16 32x256: 50 MB), they
// came back from memory, 25 -> 34 ms per layer once the units ran pair after pair.
constexpr int64_t kWaveBytes = 4 << 20;

// One call's shapes and tensors. A pair's packed keys: blocks of kKeys keys, each [head_dim][kKeys], zero past
// the last token; then, 16-bit only, its values widened to float32, [tokens][head_dim] (pair_values floats).
template <typename T>
struct Prefill {
  const at::Tensor &q, &k, &v;
  at::Tensor& out;
  float scale;
  int64_t tokens, heads, head_dim, kv_heads, group, pair_keys, pair_values, query_block, blocks;

  Prefill(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, at::Tensor& out)
      : q(q), k(k), v(v), out(out), scale(static_cast<float>(scale)), tokens(q.size(1)), heads(q.size(2)),
        head_dim(q.size(3)), kv_heads(k.size(2)), group(heads / kv_heads),
        pair_keys((tokens + kKeys - 1) / kKeys * kKeys * head_dim),
        pair_values(std::is_same_v<T, float> ? 0 : tokens * head_dim),
        query_block(std::max<int64_t>(kQueryBlock, kUnitRows / group)),
        blocks((tokens + query_block - 1) / query_block) {}

  const T* key(int64_t b, int64_t j, int64_t kvh) const {
    return k.data_ptr<T>() + b * k.stride(0) + j * k.stride(1) + kvh * k.stride(2);
  }
  const T* value(int64_t b, int64_t j, int64_t kvh) const {
    return v.data_ptr<T>() + b * v.stride(0) + j * v.stride(1) + kvh * v.stride(2);
  }
};

// The pair's keys transposed in blocks of kKeys, so that a score block reads one contiguous run (8 KB for head_dim
// 64 on AVX-512): transposed whole, [head_dim][tokens], rows a power of two apart fell into the same L1 sets
// (SmolLM2 float32 1x512, 51 -> 272 GFLOP/s). 16-bit values are widened once here, not once per unit.
template <typename T>
void pack_pair(const Prefill<T>& p, int64_t b, int64_t kvh, float* keys_t, float* values_f) {
  const int64_t key_slots = p.pair_keys / p.head_dim;
  for (int64_t j = 0; j < key_slots; ++j) {
    float* column = keys_t + j / kKeys * kKeys * p.head_dim + j % kKeys;
    const T* key = j < p.tokens ? p.key(b, j, kvh) : nullptr;
    for (int64_t d = 0; d < p.head_dim; ++d) column[d * kKeys] = key ? static_cast<float>(key[d]) : 0.f;
  }
  if constexpr (!std::is_same_v<T, float>) {
    for (int64_t j = 0; j < p.tokens; ++j) {
      const T* value = p.value(b, j, kvh);
      for (int64_t d = 0; d < p.head_dim; ++d) values_f[j * p.head_dim + d] = static_cast<float>(value[d]);
    }
  }
}

// Per-thread scratch of a unit: its scaled query rows, their scores, one register block's outputs.
struct UnitScratch {
  std::unique_ptr<float[]> queries, scores, outs;
  int64_t score_stride;
};

// One unit: query block `block` of request b's rows of KV head kvh, against the pair's packed keys and values.
template <typename T>
void attend_unit(const Prefill<T>& p, int64_t b, int64_t kvh, int64_t block, const float* keys_t,
                 const float* values_f, UnitScratch& s) {
  const int64_t head_dim = p.head_dim, group = p.group, score_stride = s.score_stride;
  const int64_t t0 = block * p.query_block, t1 = std::min(p.tokens, t0 + p.query_block);
  const int64_t padded = (t1 + kKeys - 1) / kKeys * kKeys, rows = (t1 - t0) * group;
  constexpr bool kFloat = std::is_same_v<T, float>;
  const float* values = kFloat ? reinterpret_cast<const float*>(p.value(b, 0, kvh)) : values_f;
  const int64_t value_stride = kFloat ? p.v.stride(1) : head_dim;
  // Row m: token t0 + m / group, query head kvh * group + m % group; the scale goes on the query.
  const T* q_base = p.q.template data_ptr<T>();
  for (int64_t m = 0; m < rows; ++m) {
    const T* row = q_base + b * p.q.stride(0) + (t0 + m / group) * p.q.stride(1) +
                   (kvh * group + m % group) * p.q.stride(2);
    for (int64_t d = 0; d < head_dim; ++d) s.queries[m * head_dim + d] = static_cast<float>(row[d]) * p.scale;
  }
  for (int64_t m = 0; m < rows; m += kRows) {
    const float* qm = s.queries.get() + m * head_dim;
    float* sm = s.scores.get() + m * score_stride;
    for (int64_t j = 0; j < padded; j += kKeys) {
      const float* kj = keys_t + j * head_dim;
      switch (std::min(kRows, rows - m)) {
        case 4: score_block<4>(qm, head_dim, kj, j, sm, score_stride); break;
        case 3: score_block<3>(qm, head_dim, kj, j, sm, score_stride); break;
        case 2: score_block<2>(qm, head_dim, kj, j, sm, score_stride); break;
        default: score_block<1>(qm, head_dim, kj, j, sm, score_stride);
      }
    }
  }
  T* out_base = p.out.template data_ptr<T>();
  for (int64_t m0 = 0; m0 < rows; m0 += kRows) {
    const int64_t block_rows = std::min(kRows, rows - m0);
    float inverse[kRows];
    for (int64_t r = 0; r < block_rows; ++r) {
      const int64_t m = m0 + r;
      inverse[r] = softmax_row(s.scores.get() + m * score_stride, t0 + m / group + 1, padded);
    }
    const int64_t keys = t0 + (m0 + block_rows - 1) / group + 1;  // the block's last row sees the most
    const float* pm = s.scores.get() + m0 * score_stride;
    float* outs = s.outs.get();
    for (int64_t d0 = 0; d0 < head_dim; d0 += kValueVecs * kVec) {
      switch (block_rows) {
        case 4: value_block<4>(pm, score_stride, values, value_stride, keys, d0, outs, head_dim); break;
        case 3: value_block<3>(pm, score_stride, values, value_stride, keys, d0, outs, head_dim); break;
        case 2: value_block<2>(pm, score_stride, values, value_stride, keys, d0, outs, head_dim); break;
        default: value_block<1>(pm, score_stride, values, value_stride, keys, d0, outs, head_dim);
      }
    }
    for (int64_t r = 0; r < block_rows; ++r) {
      const int64_t m = m0 + r;
      T* dst = out_base + ((b * p.tokens + t0 + m / group) * p.heads + kvh * group + m % group) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<T>(outs[r * head_dim + d] * inverse[r]);
    }
  }
}

template <typename T>
void causal_prefill_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                           at::Tensor& out) {
  const Prefill<T> p(q, k, v, scale, out);
  const int64_t pairs = q.size(0) * p.kv_heads, pair_floats = p.pair_keys + p.pair_values;
  const int64_t wave = std::clamp<int64_t>(kWaveBytes / (4 * pair_floats), 1, pairs);
  auto packed = scratch(wave * pair_floats);
  for (int64_t first = 0; first < pairs; first += wave) {
    const int64_t wave_pairs = std::min(wave, pairs - first), units = wave_pairs * p.blocks;
    auto keys_t = [&](int64_t i) { return packed.get() + i * pair_floats; };
    auto values_f = [&](int64_t i) { return packed.get() + i * pair_floats + p.pair_keys; };
    at::parallel_for(0, wave_pairs, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        pack_pair(p, (first + i) / p.kv_heads, (first + i) % p.kv_heads, keys_t(i), values_f(i));
    });
    // Units taken by the threads in turn, pair by pair, each pair's costliest (last, with the most keys) blocks
    // first: a static split of the causal triangle would leave one thread the long blocks.
    std::atomic<int64_t> next{0};
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
      const int64_t score_stride = p.pair_keys / p.head_dim, max_rows = p.query_block * p.group;
      UnitScratch s{scratch(max_rows * p.head_dim), scratch(max_rows * score_stride), scratch(kRows * p.head_dim),
                    score_stride};
      for (int64_t u; (u = next.fetch_add(1)) < units;) {
        const int64_t i = u / p.blocks, pair = first + i, block = p.blocks - 1 - u % p.blocks;
        attend_unit(p, pair / p.kv_heads, pair % p.kv_heads, block, keys_t(i), values_f(i), s);
      }
    });
  }
}

at::Tensor causal_prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v: [requests, tokens, heads, head_dim]");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), "q, k, v: one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "float32 or bfloat16");
  TORCH_CHECK(k.sizes() == v.sizes() && q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
              "k and v of one shape, as many requests, tokens and head_dim as q");
  TORCH_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "query heads in whole groups per KV head");
  TORCH_CHECK(q.size(3) % (kValueVecs * kVec) == 0, "head_dim a multiple of ", kValueVecs * kVec);
  TORCH_CHECK(q.size(1) <= kMaxTokens, "at most ", kMaxTokens, " tokens per request");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "head_dim contiguous");
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (q.numel() == 0) return out;
  if (q.scalar_type() == at::kFloat) {
    causal_prefill_kernel<float>(q, k, v, scale, out);
  } else {
    causal_prefill_kernel<c10::BFloat16>(q, k, v, scale, out);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minisgl_cpu, m) {
  m.def("causal_prefill_attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(minisgl_cpu, CPU, m) { m.impl("causal_prefill_attention", &causal_prefill_attention); }
