// Decode attention on CPU over the paged KV pool: one new query token per request against all its cached keys and
// values, read in place through the request's row of KV slots. Built with gemm.cpp by cpu_kernels.py and called
// through cpu_decode.py, vectorized with ATen's Vectorized<float> for the ISA TorchInductor picks.
//
// It first writes the step's new K/V into the pools when given them (key, value, loc), as SGLang's counterpart,
// sgl-kernel's decode_attention_cpu (sgl-kernel/csrc/cpu/decode.cpp), does; that one also caps logits and has
// AVX-512/AMX paths for bfloat16, fp8 and MLA.
//
// The work is split into (request, chunk of positions) units, so that one long request still keeps every thread
// busy (flash-decoding's split): each unit computes its chunk's scores, its own max and exp-sum, and the weighted
// sum of its V rows; a second pass rescales the chunks of each (request, head) to a common max and combines them.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kVec = Vec::size();
// Positions whose scores are reduced together: on AVX2, eight dot products end in one transpose-and-add instead of
// eight horizontal sums.
constexpr int64_t kTile = 8;
// Accumulator vectors of the weighted V sum held in registers across a chunk's positions.
constexpr int64_t kBlock = 8;

inline float sum_lanes(const Vec& x) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, x);
}

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
// The lane sums of eight 8-lane vectors, as one vector: three rounds of pairwise adds instead of eight reductions.
inline void sum_lanes_of_eight(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                               __m256 a7, float* out) {
  __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
  __m256 t2 = _mm256_hadd_ps(a4, a5), t3 = _mm256_hadd_ps(a6, a7);
  __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31)));
}
#endif

// The lane sums of kTile vectors, as one vector of kTile floats.
inline void sum_lanes_of_tile(const Vec* acc, float* out) {
#if defined(CPU_CAPABILITY_AVX2)
  static_assert(kVec == kTile);
  sum_lanes_of_eight(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7], out);
#elif defined(CPU_CAPABILITY_AVX512)
  // Each 16-lane vector folded to 8 lanes (its halves added) first; the AVX2 reduction then sums eight of them.
  // In place of eight full reductions. With the half block below, bench/decode_attention.py on a 2-core AVX-512
  // EPYC, float32 1x512, eager against compiled us per layer, before -> after: SmolLM2 148/129 -> 112/110, dummy134
  // 277/204 -> 316/258 (a slower phase; the ratio fell 1.36 -> 1.22).
  static_assert(kVec == 2 * kTile);
  __m256 h[kTile];
  for (int64_t i = 0; i < kTile; ++i)
    h[i] = _mm256_add_ps(_mm512_castps512_ps256(acc[i]), _mm512_extractf32x8_ps(acc[i], 1));
  sum_lanes_of_eight(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], out);
#else
  for (int64_t i = 0; i < kTile; ++i) out[i] = sum_lanes(acc[i]);
#endif
}

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  Vec acc(0.f);
  int64_t d = 0;
  for (; d + kVec <= n; d += kVec) acc = at::vec::fmadd(Vec::loadu(a + d), Vec::loadu(b + d), acc);
  float sum = sum_lanes(acc);
  for (; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// Scores of one head's query against the chunk's keys (rows[p] + offset), into s[0, n).
void head_scores(const float* __restrict q, const float* const* rows, int64_t offset, int64_t n, int64_t head_dim,
                 float* __restrict s) {
  const int64_t whole = head_dim / kVec * kVec;
  int64_t p = 0;
  for (; p + kTile <= n; p += kTile) {
    Vec acc[kTile];
    for (int64_t i = 0; i < kTile; ++i) acc[i] = Vec(0.f);
    for (int64_t d = 0; d < whole; d += kVec) {
      const Vec qv = Vec::loadu(q + d);
      for (int64_t i = 0; i < kTile; ++i) acc[i] = at::vec::fmadd(qv, Vec::loadu(rows[p + i] + offset + d), acc[i]);
    }
    sum_lanes_of_tile(acc, s + p);
    for (int64_t d = whole; d < head_dim; ++d)
      for (int64_t i = 0; i < kTile; ++i) s[p + i] += q[d] * rows[p + i][offset + d];
  }
  for (; p < n; ++p) s[p] = dot(q, rows[p] + offset, head_dim);
}

// Softmax numerators in place (exp(s - max)); returns the max and the sum.
std::pair<float, float> exp_and_sum(float* s, int64_t n) {
  float max = -INFINITY;
  for (int64_t p = 0; p < n; ++p) max = std::max(max, s[p]);
  const Vec max_vec(max);
  Vec sum_vec(0.f);
  int64_t p = 0;
  for (; p + kVec <= n; p += kVec) {
    const Vec w = (Vec::loadu(s + p) - max_vec).exp_u20();
    w.store(s + p);
    sum_vec = sum_vec + w;
  }
  float sum = sum_lanes(sum_vec);
  for (; p < n; ++p) sum += (s[p] = std::exp(s[p] - max));
  return {max, sum};
}

// out[d0, d0 + block * kVec) = sum over p of w[p] * (rows[p] + offset + d0): block accumulators held in registers
// (a count fixed at compile time) across the chunk's positions, each FMA chain independent of the others.
template <int64_t block>
inline void weighted_values_block(const float* __restrict w, const float* const* rows, int64_t offset, int64_t n,
                                  int64_t d0, float* __restrict out) {
  Vec acc[block];
  for (int64_t c = 0; c < block; ++c) acc[c] = Vec(0.f);
  for (int64_t p = 0; p < n; ++p) {
    const Vec wp(w[p]);
    const float* v = rows[p] + offset + d0;
    for (int64_t c = 0; c < block; ++c) acc[c] = at::vec::fmadd(wp, Vec::loadu(v + c * kVec), acc[c]);
  }
  for (int64_t c = 0; c < block; ++c) acc[c].store(out + d0 + c * kVec);
}

// out[0, head_dim) = sum over p of w[p] * (rows[p] + offset).
void weighted_values(const float* __restrict w, const float* const* rows, int64_t offset, int64_t n,
                     int64_t head_dim, float* __restrict out) {
  const int64_t whole = head_dim / kVec * kVec;
  int64_t d0 = 0;
  for (; d0 + kBlock * kVec <= whole; d0 += kBlock * kVec) weighted_values_block<kBlock>(w, rows, offset, n, d0, out);
  // A half block (head_dim 64 on AVX-512 is four vectors): one pass over the positions for all four, where one
  // vector at a time made four passes, each one long chain of dependent FMAs.
  for (; d0 + kBlock / 2 * kVec <= whole; d0 += kBlock / 2 * kVec)
    weighted_values_block<kBlock / 2>(w, rows, offset, n, d0, out);
  for (; d0 < whole; d0 += kVec) {
    Vec acc(0.f);
    for (int64_t p = 0; p < n; ++p) acc = at::vec::fmadd(Vec(w[p]), Vec::loadu(rows[p] + offset + d0), acc);
    acc.store(out + d0);
  }
  for (int64_t d = whole; d < head_dim; ++d) {
    float acc = 0.f;
    for (int64_t p = 0; p < n; ++p) acc += w[p] * rows[p][offset + d];
    out[d] = acc;
  }
}

// A unit's rows are prefetched (prefetch_row) only up to this many bytes: past it (dummy134's 6 KB of K/V per
// position at 144 positions a unit) the requests evict each other from L2 and the kernel ran slower than without.
constexpr int64_t kMaxPrefetchBytes = 256 << 10;

// Every cache line of a pool row requested into L2 ahead of its use. In a step the pool is cold (a layer's weights
// pass through the caches between two layers' attention), and the float32 head loop reads a row a KV head's slice
// at a time, so without this each slice's first read waits on memory in turn.
inline void prefetch_row(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(p + offset, 0, 2);
}

inline std::unique_ptr<float[]> scratch(int64_t n) {
  return std::unique_ptr<float[]>(new float[std::max<int64_t>(n, 1)]);  // uninitialized: written before read
}

template <typename T>
void decode_attention_kernel(const at::Tensor& q, const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                             const at::Tensor& kv_indices, const at::Tensor& seq_lens, double scale, at::Tensor& out) {
  const int64_t batch = q.size(0), heads = q.size(1), head_dim = q.size(2);
  const int64_t kv_heads = k_buffer.size(1), groups = heads / kv_heads, slot_stride = k_buffer.stride(0);
  const int64_t num_slots = k_buffer.size(0);
  const int64_t row_floats = kv_heads * head_dim, table_stride = kv_indices.stride(0);
  const int32_t* table = kv_indices.data_ptr<int32_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const T* keys_base = k_buffer.data_ptr<T>();
  const T* values_base = v_buffer.data_ptr<T>();
  const T* q_base = q.data_ptr<T>();
  int64_t max_len = 0, total = 0;
  for (int64_t b = 0; b < batch; ++b) max_len = std::max(max_len, lens[b]), total += lens[b];
  TORCH_CHECK(kv_indices.size(1) >= max_len, "kv_indices: a column for every position of the longest request");
  // About four units per thread (a whole number of 16 positions, 32 to 256): enough to balance threads, few
  // enough that each unit's rows are worth the combine.
  const int64_t threads = at::get_num_threads();
  const int64_t chunk = std::clamp<int64_t>(((total + 4 * threads - 1) / (4 * threads) + 15) & ~int64_t{15}, 32, 256);
  const int64_t chunks = std::max<int64_t>((max_len + chunk - 1) / chunk, 1);
  // Only chunks that hold positions become units, so threads, each given a run of units, get similar work.
  std::vector<int64_t> units;  // b * chunks + c
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t c = 0; c * chunk < lens[b]; ++c) units.push_back(b * chunks + c);
  }
  // Per unit and head: the unnormalized output, then the chunk's max and exp-sum.
  const int64_t part_stride = head_dim + 2;
  auto parts = scratch(batch * chunks * heads * part_stride);
  float* part_base = parts.get();
  constexpr bool kFloat = std::is_same_v<T, float>;
  // 16-bit rows are read whole right away (widened to float32 below): nothing to prefetch ahead of.
  const bool prefetch = kFloat && 2 * chunk * row_floats * int64_t{sizeof(T)} <= kMaxPrefetchBytes;
  at::parallel_for(0, static_cast<int64_t>(units.size()), 1, [&](int64_t begin, int64_t end) {
    auto q_scaled = scratch(heads * head_dim), scores = scratch(heads * chunk);
    auto converted = scratch(kFloat ? 0 : 2 * chunk * row_floats);
    auto rows = std::make_unique<const float*[]>(2 * chunk);
    const float** key_rows = rows.get();
    const float** value_rows = rows.get() + chunk;
    for (int64_t u = begin; u < end; ++u) {
      const int64_t unit = units[u], b = unit / chunks, start = unit % chunks * chunk;
      const int64_t n = std::min(lens[b], start + chunk) - start;
      float* part = part_base + unit * heads * part_stride;
      for (int64_t i = 0; i < heads * head_dim; ++i) {
        q_scaled[i] = static_cast<float>(q_base[b * heads * head_dim + i]) * scale;
      }
      const int32_t* slots = table + b * table_stride + start;
      for (int64_t p = 0; p < n; ++p) {
        TORCH_CHECK(slots[p] >= 0 && slots[p] < num_slots, "decode_attention: kv_indices holds slot ", slots[p],
                    ", outside the ", num_slots, "-slot pool");
        const T* key = keys_base + slots[p] * slot_stride;
        const T* value = values_base + slots[p] * slot_stride;
        if (prefetch) prefetch_row(key, row_floats * sizeof(T)), prefetch_row(value, row_floats * sizeof(T));
        if constexpr (kFloat) {
          key_rows[p] = key, value_rows[p] = value;
        } else {  // 16-bit rows widened once per chunk, not once per query head reading them
          float* key_f = converted.get() + p * row_floats;
          float* value_f = converted.get() + (chunk + p) * row_floats;
          for (int64_t i = 0; i < row_floats; ++i) {
            key_f[i] = static_cast<float>(key[i]);
            value_f[i] = static_cast<float>(value[i]);
          }
          key_rows[p] = key_f, value_rows[p] = value_f;
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* s = scores.get() + h * chunk;
        const int64_t offset = h / groups * head_dim;  // the KV head this query head shares
        head_scores(q_scaled.get() + h * head_dim, key_rows, offset, n, head_dim, s);
        const auto [max, sum] = exp_and_sum(s, n);
        float* out_h = part + h * part_stride;
        weighted_values(s, value_rows, offset, n, head_dim, out_h);
        out_h[head_dim] = max, out_h[head_dim + 1] = sum;
      }
    }
  });
  T* out_base = out.data_ptr<T>();
  auto combine = [&](int64_t begin, int64_t end) {
    auto acc = scratch(head_dim);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, h = bh % heads;
      auto part = [&](int64_t c) { return part_base + ((b * chunks + c) * heads + h) * part_stride; };
      const int64_t request_chunks = (lens[b] + chunk - 1) / chunk;  // the units this request had
      float max = -INFINITY, sum = 0.f;
      for (int64_t c = 0; c < request_chunks; ++c) max = std::max(max, part(c)[head_dim]);
      std::fill(acc.get(), acc.get() + head_dim, 0.f);
      for (int64_t c = 0; c < request_chunks; ++c) {
        const float factor = std::exp(part(c)[head_dim] - max);
        sum += factor * part(c)[head_dim + 1];
        for (int64_t d = 0; d < head_dim; ++d) acc[d] += factor * part(c)[d];
      }
      const float inverse = sum > 0.f ? 1.f / sum : 0.f;  // a request with no positions attends to nothing: zeros
      for (int64_t d = 0; d < head_dim; ++d) out_base[bh * head_dim + d] = static_cast<T>(acc[d] * inverse);
    }
  };
  if (batch * heads * chunks * head_dim < (1 << 15)) {
    combine(0, batch * heads);  // small: a parallel region would cost more than it saves
  } else {
    at::parallel_for(0, batch * heads, 1, combine);
  }
}

// Each request's new K/V row (key/value [batch, kv_heads, head_dim], head_dim contiguous) into its slot loc[b], in
// place in the pools, as set_kv_buffer writes it: here instead of two index_put calls per layer, each a launch that
// costs more than a decode's few rows take to copy.
template <typename T>
void write_new_kv(at::Tensor& k_buffer, at::Tensor& v_buffer, const at::Tensor& key, const at::Tensor& value,
                  const at::Tensor& loc) {
  const int64_t batch = key.size(0), kv_heads = key.size(1), head_dim = key.size(2);
  const int64_t slots = k_buffer.size(0), slot_stride = k_buffer.stride(0);
  const int64_t* slot = loc.data_ptr<int64_t>();
  // Every slot checked before any is written: a bad one leaves the pools as they were.
  for (int64_t b = 0; b < batch; ++b)
    TORCH_CHECK(slot[b] >= 0 && slot[b] < slots, "decode_attention: KV slot ", slot[b], " is outside the ", slots,
                "-slot pool");
  for (int64_t b = 0; b < batch; ++b) {
    auto write = [&](const at::Tensor& source, at::Tensor& pool) {
      const T* from = source.data_ptr<T>() + b * source.stride(0);
      T* to = pool.data_ptr<T>() + slot[b] * slot_stride;
      for (int64_t h = 0; h < kv_heads; ++h)
        std::copy(from + h * source.stride(1), from + h * source.stride(1) + head_dim, to + h * head_dim);
    };
    write(key, k_buffer);
    write(value, v_buffer);
  }
}

at::Tensor decode_attention(const at::Tensor& q, at::Tensor k_buffer, at::Tensor v_buffer,
                            const c10::optional<at::Tensor>& key, const c10::optional<at::Tensor>& value,
                            const c10::optional<at::Tensor>& loc, const at::Tensor& kv_indices,
                            const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_buffer.dim() == 3 && v_buffer.dim() == 3,
              "q [batch, heads, head_dim], pools [slots, kv_heads, head_dim]");
  TORCH_CHECK(q.scalar_type() == k_buffer.scalar_type() && q.scalar_type() == v_buffer.scalar_type(),
              "q and the pools: one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "float32 or bfloat16");
  TORCH_CHECK(k_buffer.is_contiguous() && v_buffer.is_contiguous() && k_buffer.sizes() == v_buffer.sizes(),
              "contiguous pools of one shape");
  TORCH_CHECK(k_buffer.size(1) > 0 && q.size(2) == k_buffer.size(2) && q.size(1) % k_buffer.size(1) == 0,
              "head_dim and grouped heads");
  TORCH_CHECK(kv_indices.scalar_type() == at::kInt && kv_indices.dim() == 2 && kv_indices.stride(1) == 1,
              "kv_indices: int32 [batch, positions]");
  TORCH_CHECK(seq_lens.scalar_type() == at::kLong && seq_lens.is_contiguous(), "seq_lens: int64");
  TORCH_CHECK(kv_indices.size(0) == q.size(0) && seq_lens.numel() == q.size(0),
              "one row of kv_indices and one seq_len per request");
  TORCH_CHECK(key.has_value() == value.has_value() && key.has_value() == loc.has_value(),
              "decode_attention: key, value and loc come together (the new K/V and their slots) or not at all");
  if (key.has_value()) {
    for (const at::Tensor* kv : {&*key, &*value})
      TORCH_CHECK(kv->dim() == 3 && kv->size(0) == q.size(0) && kv->size(1) == k_buffer.size(1) &&
                      kv->size(2) == k_buffer.size(2) && kv->stride(2) == 1 &&
                      kv->scalar_type() == k_buffer.scalar_type(),
                  "decode_attention: the new key and value must be [batch, kv_heads, head_dim] in the pools' dtype");
    TORCH_CHECK(loc->scalar_type() == at::kLong && loc->is_contiguous() && loc->numel() == q.size(0),
                "decode_attention: loc must be one int64 slot per request");
    if (q.scalar_type() == at::kFloat)
      write_new_kv<float>(k_buffer, v_buffer, *key, *value, *loc);
    else
      write_new_kv<c10::BFloat16>(k_buffer, v_buffer, *key, *value, *loc);
  }
  const at::Tensor q_rows = q.contiguous();
  at::Tensor out = at::empty(q_rows.sizes(), q_rows.options());
  if (q.scalar_type() == at::kFloat) {
    decode_attention_kernel<float>(q_rows, k_buffer, v_buffer, kv_indices, seq_lens, scale, out);
  } else {
    decode_attention_kernel<c10::BFloat16>(q_rows, k_buffer, v_buffer, kv_indices, seq_lens, scale, out);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minisgl_cpu, m) {
  m.def(
      "decode_attention(Tensor q, Tensor(a!) k_buffer, Tensor(b!) v_buffer, Tensor? key, Tensor? value, Tensor? loc,"
      " Tensor kv_indices, Tensor seq_lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(minisgl_cpu, CPU, m) { m.impl("decode_attention", &decode_attention); }
