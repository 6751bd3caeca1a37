// SiluAndMul on CPU: silu(gate) * up over the fused gate_up projection's [rows, 2d] output, into a fresh [rows, d].
// Built by cpu_kernels.py, called by activation.py.
//
// SGLang's counterpart is sgl-kernel's silu_and_mul_cpu (sgl-kernel/csrc/cpu/activation.cpp), with gelu variants.
//
// aten's chunk, silu and mul are three launches and, in bfloat16, silu's rounded output written out and read back;
// here one pass per row computes both, rounding where HF rounds (silu's output in the activations' dtype, then the
// product), with aten's own formula, gate / (1 + exp(-gate)), on the same vector exp.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kVec = Vec::size();
constexpr int64_t kGrainElements = 1 << 15;  // as in norm.cpp: a decode's rows stay on the calling thread

// silu over n floats, in place. Two vectors per step, as aten's vectorized loops go, so that the same elements
// fall to the scalar tail (std::exp, which rounds otherwise than the vector exp) as in aten's silu of a row.
void silu(float* g, int64_t n) {
  const Vec one(1.f);
  int64_t i = 0;
  for (; i + 2 * kVec <= n; i += 2 * kVec) {
    const Vec a = Vec::loadu(g + i), b = Vec::loadu(g + i + kVec);
    (a / (one + a.neg().exp())).store(g + i);
    (b / (one + b.neg().exp())).store(g + i + kVec);
  }
  for (; i < n; ++i) g[i] = g[i] / (1.f + std::exp(-g[i]));
}

template <typename T>
void silu_and_mul_rows(const T* x, T* out, int64_t rows, int64_t d) {
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, 2 * d)), [&](int64_t begin, int64_t end) {
    std::vector<float> gate(d);
    for (int64_t r = begin; r < end; ++r) {
      const T* gate_row = x + r * 2 * d;
      const T* up_row = gate_row + d;
      for (int64_t i = 0; i < d; ++i) gate[i] = static_cast<float>(gate_row[i]);
      silu(gate.data(), d);
      T* out_row = out + r * d;
      for (int64_t i = 0; i < d; ++i)
        out_row[i] = static_cast<T>(static_cast<float>(static_cast<T>(gate[i])) * static_cast<float>(up_row[i]));
    }
  });
}

at::Tensor silu_and_mul(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat || x_in.scalar_type() == at::kBFloat16,
              "silu_and_mul: float32 or bfloat16 only, got ", x_in.scalar_type());
  TORCH_CHECK(x_in.dim() >= 1 && x_in.size(-1) % 2 == 0, "silu_and_mul: the last dimension must be [gate, up]");
  const auto x = x_in.contiguous();
  const int64_t d = x.size(-1) / 2, rows = d ? x.numel() / (2 * d) : 0;
  auto sizes = x.sizes().vec();
  sizes.back() = d;
  auto out = at::empty(sizes, x.options());
  if (x.scalar_type() == at::kFloat)
    silu_and_mul_rows(x.data_ptr<float>(), out.data_ptr<float>(), rows, d);
  else
    silu_and_mul_rows(x.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), rows, d);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minisgl_cpu, m) { m.def("silu_and_mul(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(minisgl_cpu, CPU, m) { m.impl("silu_and_mul", &silu_and_mul); }
