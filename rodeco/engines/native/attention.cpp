// rodeco's decode attention on CPU over a paged cache, the op rodeco::paged_attention that the Llama engine's eager
// and compiled steps call. One query token a row; a KV head's query heads (g of them) computed together; each row's
// keys and values read in place through its block table, once. Keys are stored by column (the transposed layout:
// token stride 1), so a chunk of W tokens' scores is W lanes of fused multiply-adds over head_dim, with no horizontal
// sums. Scores, softmax and sums in fp32; a row's arithmetic depends only on its inputs (not the batch, nor the
// threads).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

// Lanes: one vector register of fp32. With AVX-512, 16; with AVX2 only, 8, so that a run's NB * G sums fit its 16
// registers (16 lanes there are two registers each, and the sums spill: on an AVX2-only AMD EPYC the kernels ran 6 to
// 11 times slower). head_dim stays a multiple of 16 (``LANES`` in __init__.py) whatever the width; the paged
// kernel's block is a multiple of the width (``WIDTH`` there: the Llama engine's blocks are one vector of tokens).
#if defined(__AVX512F__) || !defined(__AVX2__)
constexpr int64_t W = 16;
#else
constexpr int64_t W = 8;
#endif
constexpr int64_t LANES = 16;  // head_dim is a multiple of it
static_assert(LANES % W == 0, "the contract's multiple holds whole vectors");
typedef float vf __attribute__((vector_size(W * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(W * sizeof(int32_t))));
typedef uint32_t vu __attribute__((vector_size(W * sizeof(uint32_t))));
typedef uint16_t vh __attribute__((vector_size(W * sizeof(uint16_t))));

inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
inline vf load(const c10::BFloat16* p) {
  vh h; std::memcpy(&h, p, sizeof h);
  const vu w = __builtin_convertvector(h, vu) << 16;
  vf v; std::memcpy(&v, &w, sizeof v); return v;
}
inline vf load(const c10::Half* p) { vf v; for (int64_t l = 0; l < W; ++l) v[l] = static_cast<float>(p[l]); return v; }
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// exp(x) lane by lane: 2^k * p(f), k = round(x / ln 2), |f| <= ln 2 / 2, p the degree-6 Taylor polynomial (relative
// error below 2e-7); 0 below -87, where the masked positions' -inf lands.
inline vf exp_v(vf x) {
  const vi under = x < -87.f;
  x = under ? vf{} - 87.f : x;
  const vf kf = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest even
  const vf f = (x - kf * 0.693145751953125f) - kf * 1.428606765330187045e-06f;
  vf p = vf{} + 1.f / 720.f;
  p = p * f + 1.f / 120.f;
  p = p * f + 1.f / 24.f;
  p = p * f + 1.f / 6.f;
  p = p * f + 0.5f;
  p = p * f + 1.f;
  p = p * f + 1.f;
  const vi bits = (__builtin_convertvector(kf, vi) + 127) << 23;
  vf two_k; std::memcpy(&two_k, &bits, sizeof two_k);
  return under ? vf{} : p * two_k;
}

// acc[j * C + c] += sum_t p[j * ld + t] * v[t * vt + c * W :][:W] for CK columns of W from c = 0, in order of t,
// the sums held in registers over t.
template <int G, int CK, typename T>
inline void values_run(const float* p, int64_t ld, const T* v, int64_t vt, int64_t n, vf* acc, int64_t C) {
  vf a[G][CK];
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < CK; ++c) a[j][c] = acc[j * C + c];
  for (int64_t t = 0; t < n; ++t) {
    const T* row = v + t * vt;
    for (int c = 0; c < CK; ++c) {
      const vf x = load(row + c * W);
      for (int j = 0; j < G; ++j) a[j][c] += p[j * ld + t] * x;
    }
  }
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < CK; ++c) acc[j * C + c] = a[j][c];
}

// acc[j][:] += sum_t p[j * ld + t] * v[t * vt + :], in order of t; D a multiple of W.
template <int G, typename T>
void values(const float* p, int64_t ld, int64_t D, const T* v, int64_t vt, int64_t n, vf* acc) {
  constexpr int CK = G <= 4 ? 4 : 2;  // G * CK sums in registers
  const int64_t C = D / W;
  int64_t c0 = 0;
  for (; c0 + CK <= C; c0 += CK) values_run<G, CK, T>(p, ld, v + c0 * W, vt, n, acc + c0, C);
  for (; c0 < C; ++c0) values_run<G, 1, T>(p, ld, v + c0 * W, vt, n, acc + c0, C);
}

// The paged cache's decode attention: row b's lens[b] slots lie in blocks of bs tokens of a pool, the blocks named
// in order by tables[b] (keys by column within a block: [NB, H, D, bs], token stride 1; values by row: [NB, H, bs,
// D]); its first starts[b] slots are its prompt's padding (a prompt ends on a block boundary). The row's chunks of W
// slots are scored in runs of NB chunks, each chunk read through its block's address, so a run may span blocks; the
// slots before starts[b] and the lanes past lens[b] are masked (their values weigh 0). What a row computes depends on its own tokens only.
template <int G, int NB, typename T>
inline void dots_at(const float* qf, int64_t D, const T* const (&k)[NB], int64_t kd, vf (&a)[NB][G]) {
  for (int64_t d = 0; d < D; ++d)
    for (int b = 0; b < NB; ++b) {
      const vf kv = load(k[b] + d * kd);
      for (int j = 0; j < G; ++j) a[b][j] += qf[j * D + d] * kv;
    }
}

template <int G, typename T>
void attend_paged(const at::Tensor& q, const at::Tensor& kpool, const at::Tensor& vpool, const at::Tensor& tables,
                  const at::Tensor& lens, const at::Tensor& starts, float scale, at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), bs = kpool.size(3), M = tables.size(1);
  const int64_t C = D / W, per = bs / W;  // chunks of W tokens a block
  const int64_t* ld_ = lens.data_ptr<int64_t>();
  const int64_t* sd_ = starts.data_ptr<int64_t>();
  int64_t most = 0;
  for (int64_t b = 0; b < B; ++b) most = std::max(most, ld_[b]);
  const int64_t ld = (most + W - 1) / W * W + 0;
  const T *qd = q.data_ptr<T>(), *kd = kpool.data_ptr<T>(), *vd = vpool.data_ptr<T>();
  const int64_t* td = tables.data_ptr<int64_t>();
  T* od = out.data_ptr<T>();
  const int64_t q0 = q.stride(0), q1 = q.stride(1), q2 = q.stride(2);
  const int64_t k0 = kpool.stride(0), k1 = kpool.stride(1), k2 = kpool.stride(2);
  const int64_t v0 = vpool.stride(0), v1 = vpool.stride(1), v2 = vpool.stride(2);
  const int64_t t0s = tables.stride(0);
  constexpr int NB = G <= 2 ? 6 : G <= 4 ? 4 : 2;  // chunks a run: NB * G accumulators stay in registers
  at::parallel_for(0, B * H, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> qf(G * D), s(G * ld);
    std::vector<vf> acc(G * C);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t b = i / H, h = i % H, L = ld_[b], chunks = (L + W - 1) / W;
      const int64_t* tb = td + t0s * b;
      const T* qb = qd + q0 * b + q1 * h;
      for (int j = 0; j < G; ++j)
        for (int64_t d = 0; d < D; ++d) qf[j * D + d] = static_cast<float>(qb[q2 * j + d]);
      for (int64_t c0 = 0; c0 < chunks; c0 += NB) {
        const T* kc[NB];
        for (int r = 0; r < NB; ++r) {  // past the row's last chunk: its last chunk again, the scores unused
          const int64_t c = std::min<int64_t>(c0 + r, chunks - 1);
          kc[r] = kd + k0 * tb[c / per] + k1 * h + (c % per) * W;
        }
        vf a[NB][G] = {};
        dots_at<G, NB, T>(qf.data(), D, kc, k2, a);
        for (int r = 0; r < NB && c0 + r < chunks; ++r)
          for (int j = 0; j < G; ++j) store(s.data() + j * ld + (c0 + r) * W, a[r][j] * scale);
      }
      const int64_t Lr = chunks * W;
      float inv[G];
      for (int j = 0; j < G; ++j) {
        float* r = s.data() + j * ld;
        std::fill(r, r + sd_[b], -std::numeric_limits<float>::infinity());
        std::fill(r + L, r + Lr, -std::numeric_limits<float>::infinity());
        vf mv = load(r);
        for (int64_t t0 = W; t0 < Lr; t0 += W) { const vf x = load(r + t0); mv = mv > x ? mv : x; }
        float m = mv[0];
        for (int64_t l = 1; l < W; ++l) m = std::max(m, mv[l]);
        vf zv = {};
        for (int64_t t0 = 0; t0 < Lr; t0 += W) { const vf e = exp_v(load(r + t0) - m); store(r + t0, e); zv += e; }
        float z = 0.f;
        for (int64_t l = 0; l < W; ++l) z += zv[l];
        inv[j] = 1.f / z;
      }
      std::fill(acc.begin(), acc.end(), vf{});
      for (int64_t blk = 0; blk * bs < L; ++blk) {
        const int64_t n = std::min(bs, L - blk * bs);
        values<G, T>(s.data() + blk * bs, ld, D, vd + v0 * tb[blk] + v1 * h, v2, n, acc.data());
      }
      T* ob = od + ((b * H + h) * G) * D;
      for (int j = 0; j < G; ++j)
        for (int64_t c = 0; c < C; ++c) {
          const vf o = acc[j * C + c] * inv[j];
          for (int64_t l = 0; l < W; ++l) ob[j * D + c * W + l] = static_cast<T>(o[l]);
        }
    }
  });
}

template <typename T>
void attend_paged_g(const at::Tensor& q, const at::Tensor& kpool, const at::Tensor& vpool, const at::Tensor& tables,
                    const at::Tensor& lens, const at::Tensor& starts, float scale, at::Tensor& out) {
  switch (q.size(2)) {
#define RODECO_G(n) case n: return attend_paged<n, T>(q, kpool, vpool, tables, lens, starts, scale, out);
    RODECO_G(1) RODECO_G(2) RODECO_G(3) RODECO_G(4) RODECO_G(5) RODECO_G(6) RODECO_G(7) RODECO_G(8)
#undef RODECO_G
    default: TORCH_CHECK(false, "rodeco::paged_attention: at most 8 query heads a KV head, got ", q.size(2));
  }
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& kpool, const at::Tensor& vpool,
                           const at::Tensor& tables, const at::Tensor& lens, const at::Tensor& starts,
                           double scale) {
  TORCH_CHECK(q.dim() == 4 && kpool.dim() == 4 && vpool.dim() == 4 && tables.dim() == 2 && lens.dim() == 1 &&
                  starts.dim() == 1,
              "rodeco::paged_attention: q [B, H, g, D], kpool [N, H, D, bs], vpool [N, H, bs, D], tables [B, M], "
              "lens [B], starts [B]");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), N = kpool.size(0), bs = kpool.size(3);
  TORCH_CHECK(D % LANES == 0 && bs % W == 0, "rodeco::paged_attention: head_dim must be a multiple of ", LANES,
              " and the block size of ", W);
  TORCH_CHECK(q.stride(3) == 1 && kpool.is_contiguous() && vpool.is_contiguous(),
              "rodeco::paged_attention: the pools contiguous (keys by column), queries by row");
  TORCH_CHECK(kpool.size(1) == H && kpool.size(2) == D && vpool.size(0) == N && vpool.size(1) == H &&
              vpool.size(2) == bs && vpool.size(3) == D, "rodeco::paged_attention: pool shapes do not match q");
  for (const at::Tensor* t : {&kpool, &vpool})
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "rodeco::paged_attention: q and the pools must share a dtype");
  TORCH_CHECK(tables.scalar_type() == at::kLong && lens.scalar_type() == at::kLong &&
                  starts.scalar_type() == at::kLong && tables.size(0) == B && lens.numel() == B && starts.numel() == B,
              "rodeco::paged_attention: tables int64 [B, M], lens int64 [B], starts int64 [B]");
  const at::Tensor tc = tables.contiguous(), lc = lens.contiguous(), stc = starts.contiguous();
  const int64_t *td = tc.data_ptr<int64_t>(), *ld = lc.data_ptr<int64_t>(), *sd = stc.data_ptr<int64_t>();
  const int64_t M = tables.size(1);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(ld[b] >= 1 && ld[b] <= M * bs, "rodeco::paged_attention: row ", b, " holds ", ld[b],
                " tokens, its table ", M * bs);
    TORCH_CHECK(sd[b] >= 0 && sd[b] < ld[b], "rodeco::paged_attention: row ", b, " starts at ", sd[b],
                " of its ", ld[b], " slots");
    for (int64_t j = 0; j * bs < ld[b]; ++j)
      TORCH_CHECK(td[b * M + j] >= 0 && td[b * M + j] < N, "rodeco::paged_attention: row ", b, " names block ",
                  td[b * M + j], " of ", N);
  }
  at::Tensor out = at::empty(q.sizes(), q.options());
  const float sc = static_cast<float>(scale);
  switch (q.scalar_type()) {
    case at::kFloat: attend_paged_g<float>(q, kpool, vpool, tc, lc, stc, sc, out); break;
    case at::kBFloat16: attend_paged_g<c10::BFloat16>(q, kpool, vpool, tc, lc, stc, sc, out); break;
    case at::kHalf: attend_paged_g<c10::Half>(q, kpool, vpool, tc, lc, stc, sc, out); break;
    default: TORCH_CHECK(false, "rodeco::paged_attention: float32, bfloat16 or float16, got ", q.scalar_type());
  }
  return out;
}

int64_t lanes() { return W; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(rodeco, m) {
  m.def("lanes() -> int", &lanes);
  m.def("paged_attention(Tensor q, Tensor kpool, Tensor vpool, Tensor tables, Tensor lens, Tensor starts, "
        "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(rodeco, CPU, m) {
  m.impl("paged_attention", &paged_attention);
}
