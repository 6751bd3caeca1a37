// RMSNorm on CPU, with SGLang's fused residual add: rmsnorm(x, w, eps) and fused_add_rmsnorm(x, residual, w, eps),
// which first adds x into residual in place and normalizes that sum. Built by cpu_kernels.py, called by layernorm.py.
//
// SGLang's counterparts are sgl-kernel's rmsnorm_cpu and fused_add_rmsnorm_cpu (sgl-kernel/csrc/cpu/norm.cpp), which
// also cover the Gemma variant and normalize in place.
//
// aten runs the same math as seven kernels (add, cast, pow, mean, add, rsqrt, mul) plus the weight's multiply, each
// a pass over the activations and, at decode, each costing more to launch than its one row takes. Here each row is
// one pass: the residual sum and the squares in one loop, the scaled output in a second, from a float32 row in L1.
// Every step rounds where HF's LlamaRMSNorm rounds (the sum in the activations' dtype, the normalized row cast back
// to it before the weight's multiply); only the sum of squares is added in another order.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kVec = Vec::size();
// Elements per parallel task: a decode's few rows stay on the calling thread, where waking the others would cost
// more than the rows take.
constexpr int64_t kGrainElements = 1 << 15;

float sum_of_squares(const float* h, int64_t n) {
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + kVec <= n; i += kVec) {
    const Vec v = Vec::loadu(h + i);
    acc = at::vec::fmadd(v, v, acc);
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc);
  for (; i < n; ++i) sum += h[i] * h[i];
  return sum;
}

// residual may be null (no add): then the rows of x are normalized as they are.
template <typename T>
void rmsnorm_rows(const T* x, T* residual, const T* weight, T* out, int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, n)), [&](int64_t begin, int64_t end) {
    std::vector<float> h(n);
    for (int64_t r = begin; r < end; ++r) {
      const T* x_row = x + r * n;
      if (residual) {
        T* res_row = residual + r * n;
        for (int64_t i = 0; i < n; ++i) {
          res_row[i] = static_cast<T>(static_cast<float>(res_row[i]) + static_cast<float>(x_row[i]));
          h[i] = static_cast<float>(res_row[i]);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) h[i] = static_cast<float>(x_row[i]);
      }
      const float inv_rms = 1.f / std::sqrt(sum_of_squares(h.data(), n) / static_cast<float>(n) + eps);
      T* out_row = out + r * n;
      for (int64_t i = 0; i < n; ++i) {
        const T normed = static_cast<T>(h[i] * inv_rms);
        out_row[i] = static_cast<T>(static_cast<float>(normed) * static_cast<float>(weight[i]));
      }
    }
  });
}

void check_inputs(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "rmsnorm: float32 or bfloat16 activations only, got ", x.scalar_type());
  TORCH_CHECK(weight.dim() == 1 && weight.scalar_type() == x.scalar_type() && weight.is_contiguous() &&
                  x.dim() >= 1 && x.size(-1) == weight.size(0),
              "rmsnorm: the weight must be a contiguous vector of x's last dimension and dtype");
}

at::Tensor rmsnorm_impl(const at::Tensor& x_in, at::Tensor* residual, const at::Tensor& weight, double eps) {
  check_inputs(x_in, weight);
  const auto x = x_in.contiguous();
  auto out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  if (x.scalar_type() == at::kFloat)
    rmsnorm_rows(x.data_ptr<float>(), residual ? residual->data_ptr<float>() : nullptr, weight.data_ptr<float>(),
                  out.data_ptr<float>(), rows, n, static_cast<float>(eps));
  else
    rmsnorm_rows(x.data_ptr<c10::BFloat16>(), residual ? residual->data_ptr<c10::BFloat16>() : nullptr,
                  weight.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), rows, n, static_cast<float>(eps));
  return out;
}

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return rmsnorm_impl(x, nullptr, weight, eps);
}

at::Tensor fused_add_rmsnorm(const at::Tensor& x, at::Tensor residual, const at::Tensor& weight, double eps) {
  TORCH_CHECK(residual.is_contiguous() && residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
              "fused_add_rmsnorm: the residual must be contiguous, with x's shape and dtype");
  return rmsnorm_impl(x, &residual, weight, eps);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minisgl_cpu, m) {
  m.def("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("fused_add_rmsnorm(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(minisgl_cpu, CPU, m) {
  m.impl("rmsnorm", &rmsnorm);
  m.impl("fused_add_rmsnorm", &fused_add_rmsnorm);
}
