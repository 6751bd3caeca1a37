// Rotary position embedding on CPU (neox style: the two halves of each head rotated against each other), applied
// in place to q and k, which may be views into the fused qkv projection's output. Built by cpu_kernels.py, called by
// rotary_embedding.py.
//
// SGLang's counterpart is sgl-kernel's rotary_embedding_cpu (sgl-kernel/csrc/cpu/rope.cpp), which also handles the
// GPT-J interleaved layout and partial rotary dimensions.
//
// aten needs a lookup, a cat and a cast of cos/sin, then a multiply, a roll and an addcmul per tensor, each a kernel
// launch that costs more than a decode token's few heads take. Here each token's cos/sin row is read from the table
// and both tensors' heads are rotated in one loop, rounding as HF's apply_rotary_pos_emb does: cos and sin cast to
// the activations' dtype, each product rounded, then the sum.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>

namespace {

constexpr int64_t kGrainElements = 1 << 15;  // as in norm.cpp: a decode's tokens stay on the calling thread

struct Heads {  // a [tokens, heads, head_dim] tensor's pointer and strides (head_dim contiguous)
  void* data;
  int64_t heads, token_stride, head_stride;
};

template <typename T>
inline void rotate_head(T* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float c = static_cast<float>(static_cast<T>(cos[i])), s = static_cast<float>(static_cast<T>(sin[i]));
    const float x1 = static_cast<float>(x[i]), x2 = static_cast<float>(x[i + half]);
    const float x1c = static_cast<T>(x1 * c), x2s = static_cast<T>(x2 * s);
    const float x2c = static_cast<T>(x2 * c), x1s = static_cast<T>(x1 * s);
    x[i] = static_cast<T>(x1c - x2s);
    x[i + half] = static_cast<T>(x2c + x1s);
  }
}

template <typename T>
void rotate(const int64_t* positions, int64_t tokens, Heads q, Heads k, const float* cos, const float* sin,
            int64_t half) {
  const int64_t per_token = (q.heads + k.heads) * 2 * half;
  at::parallel_for(0, tokens, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, per_token)), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos_row = cos + positions[t] * half;
      const float* sin_row = sin + positions[t] * half;
      for (const Heads& x : {q, k})
        for (int64_t h = 0; h < x.heads; ++h)
          rotate_head(static_cast<T*>(x.data) + t * x.token_stride + h * x.head_stride, cos_row, sin_row, half);
    }
  });
}

Heads heads_of(at::Tensor& x, int64_t tokens, int64_t head_dim, const char* name) {
  TORCH_CHECK(x.dim() == 3 && x.size(0) == tokens && x.size(2) == head_dim && x.stride(2) == 1,
              "rotary_embedding: ", name, " must be [tokens, heads, head_dim] with head_dim contiguous, got ",
              x.sizes());
  return {x.data_ptr(), x.size(1), x.stride(0), x.stride(1)};
}

// cos, sin: [max_position, head_dim / 2] float32 tables, indexed by position.
void rotary_embedding(const at::Tensor& positions_in, at::Tensor q, at::Tensor k, const at::Tensor& cos,
                      const at::Tensor& sin) {
  TORCH_CHECK(q.scalar_type() == k.scalar_type() &&
                  (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "rotary_embedding: q and k must both be float32 or both bfloat16");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.dim() == 2 && cos.sizes() == sin.sizes(),
              "rotary_embedding: cos and sin must be contiguous float32 [max_position, head_dim / 2] tables");
  const auto positions = positions_in.to(at::kLong).contiguous();
  const int64_t tokens = positions.numel(), half = cos.size(1);
  const Heads q_heads = heads_of(q, tokens, 2 * half, "q"), k_heads = heads_of(k, tokens, 2 * half, "k");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), "rotary_embedding: position ", pos[t], " is outside the ",
                cos.size(0), "-position table");
  if (q.scalar_type() == at::kFloat)
    rotate<float>(pos, tokens, q_heads, k_heads, cos.data_ptr<float>(), sin.data_ptr<float>(), half);
  else
    rotate<c10::BFloat16>(pos, tokens, q_heads, k_heads, cos.data_ptr<float>(), sin.data_ptr<float>(), half);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minisgl_cpu, m) {
  m.def("rotary_embedding(Tensor positions, Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin) -> ()");
}

TORCH_LIBRARY_IMPL(minisgl_cpu, CPU, m) { m.impl("rotary_embedding", &rotary_embedding); }
