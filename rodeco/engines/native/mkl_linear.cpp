// MKL's packed fp32 GEMM (rodeco::mkl_pack, rodeco::mkl_linear: cblas_sgemm_pack and
// cblas_sgemm_compute, which PyTorch's x86 builds carry in libtorch_cpu): the compiled step's linears on an Intel CPU
// in fp32 (rodeco.engines.compiled). The weight is packed once, for 64 rows; a call computes any number of rows with
// it. PyTorch's own mkl::_mkl_linear falls back to another GEMM whenever the rows are not the packed number, whose
// products round otherwise at a few rows; the packed compute here serves every batch, so a row's logits do not
// depend on the batch (rodeco.engines.llama's check, FastWeights, refuses it where they would). The symbols are weak:
// a build of PyTorch without MKL loads this file, and rodeco::mkl_ready says false.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>

extern "C" {
// MKL's packed GEMM (mkl_cblas.h, LP64: MKL_INT is int; the CBLAS enums are ints)
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k) __attribute__((weak));
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha, const float* src,
                      int ld, float* dest) __attribute__((weak));
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc) __attribute__((weak));
}

namespace {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;
constexpr int kPackRows = 64;  // the rows MKL packs the weight for; a call computes any number with it

bool mkl_ready() { return cblas_sgemm_pack_get_size && cblas_sgemm_pack && cblas_sgemm_compute; }

// w [n, k] fp32 -> MKL's packed form of w^T (opaque bytes, kept in a uint8 tensor)
at::Tensor mkl_pack(const at::Tensor& w) {
  TORCH_CHECK(mkl_ready(), "rodeco::mkl_pack: this build of PyTorch has no MKL packed GEMM");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.device().is_cpu(),
              "rodeco::mkl_pack: a 2-D fp32 CPU weight, got ", w.sizes(), " ", w.scalar_type());
  const auto wc = w.contiguous();
  const int n = wc.size(0), k = wc.size(1);
  const size_t bytes = cblas_sgemm_pack_get_size(kBMatrix, kPackRows, n, k);
  auto out = at::empty({static_cast<int64_t>(bytes) + 64}, wc.options().dtype(at::kByte));
  auto* dest = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(out.data_ptr()) + 63) & ~uintptr_t(63));
  cblas_sgemm_pack(kRowMajor, kBMatrix, kTrans, kPackRows, n, k, 1.0f, wc.data_ptr<float>(), k, dest);
  return out;
}

// x [..., k] @ w^T + b with w packed by mkl_pack: any number of rows, each row's products in the same order
at::Tensor mkl_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& b, int64_t n) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "rodeco::mkl_linear: fp32 CPU input");
  const auto xc = x.contiguous();
  const int64_t k = xc.size(-1), m = xc.numel() / std::max<int64_t>(k, 1);
  auto shape = xc.sizes().vec();
  shape.back() = n;
  auto y = at::empty(shape, xc.options());
  const auto* p = reinterpret_cast<const float*>((reinterpret_cast<uintptr_t>(packed.data_ptr()) + 63) &
                                                 ~uintptr_t(63));
  if (m == 1) {  // MKL answers one row of a small weight by another kernel (other round-off): computed as two rows
    auto x2 = at::zeros({2, k}, xc.options());
    x2[0].copy_(xc.reshape({k}));
    auto y2 = at::empty({2, n}, xc.options());
    cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, 2, n, k, x2.data_ptr<float>(), k, p, k, 0.0f,
                        y2.data_ptr<float>(), n);
    y.view({n}).copy_(y2[0]);
  } else if (m > 1) {
    cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m, n, k, xc.data_ptr<float>(), k, p, k, 0.0f,
                        y.data_ptr<float>(), n);
  }
  if (b.has_value()) y.add_(*b);
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rodeco, m) {
  m.def("mkl_ready() -> bool", &mkl_ready);
  m.def("mkl_pack(Tensor w) -> Tensor", &mkl_pack);
  m.def("mkl_linear(Tensor x, Tensor packed, Tensor? b, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(rodeco, CPU, m) {
  m.impl("mkl_linear", &mkl_linear);
}
