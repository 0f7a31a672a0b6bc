// rodeco's decode attention on CPU, the op rodeco::decode_attention that the fast engine's compiled step calls.
// One query token a row; a KV head's query heads (g of them) computed together; each row's prompt keys and values
// read through its prompt index, its own read once. Keys are stored by column (the transposed layout: token stride
// 1), so a block of W tokens' scores is W lanes of fused multiply-adds over head_dim, with no horizontal sums.
// Scores, softmax and sums in fp32; a row's arithmetic depends only on its inputs (not the batch, nor the threads).
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
constexpr int64_t LANES = 16;  // head_dim is a multiple of it (and decode_attention's inputs)
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
template <typename T> inline vf load_n(const T* p, int64_t n) {  // the first n < W lanes, the rest 0
  T buf[W] = {};
  for (int64_t l = 0; l < W; ++l) if (l < n) buf[l] = p[l];
  return load(buf);
}
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

// Rows of memory to fetch into the cache while a loop runs, one row an iteration: ``rows`` rows of ``n`` elements
// from p, ``stride`` apart. The kernel fetches the next task's own keys and values this way, spread over the
// current task's dot products (a row's own caches are read once a step, from memory: all layers' do not fit in
// the cache), so that their reads overlap its arithmetic (fetched all at once as a task began, they gained nothing
// measurable).
template <typename T> struct Fetch {
  const T* p = nullptr;
  int64_t stride = 0, n = 0, rows = 0;
  __attribute__((always_inline)) inline void row(int64_t d) const {  // inlined: a call would spill the sums
    if (d < rows)
      for (int64_t x = 0; x < n; x += 64 / int64_t(sizeof(T))) __builtin_prefetch(p + d * stride + x, 0, 3);
  }
};

// a[b][j] = <q_j, keys of block b> for NBK blocks of 16 tokens from k (by column: token t's d-th value at
// k[d * kd + t]), summed over d in order, d outermost: each of the keys' rows is read left to right, NBK * 16 tokens
// in a run. ``wl``: the valid lanes of the last block when it is read lane by lane (``LAST_SHORT``). ``fetch``:
// its row d is fetched with the d-th row of keys.
template <int G, int NBK, bool LAST_SHORT, typename T>
inline void dots(const float* qf, int64_t D, const T* k, int64_t kd, int64_t wl, vf (&a)[NBK][G],
                 const Fetch<T>& fetch) {
  for (int64_t d = 0; d < D; ++d) {
    fetch.row(d);
    const T* r = k + d * kd;
    for (int b = 0; b < NBK; ++b) {
      const vf kv = LAST_SHORT && b + 1 == NBK ? load_n(r + b * W, wl) : load(r + b * W);
      for (int j = 0; j < G; ++j) a[b][j] += qf[j * D + d] * kv;
    }
  }
}

// a[0 .. nb) = ``dots`` over nb <= NB blocks (``sh``: the last one read lane by lane), a template for each nb.
template <int G, int NB, typename T>
inline void dots_upto(int nb, bool sh, const float* qf, int64_t D, const T* k, int64_t kd, int64_t wl,
                      vf (&a)[NB][G], const Fetch<T>& fetch) {
  if constexpr (NB > 1) {
    if (nb < NB) {
      vf r[NB - 1][G] = {};
      dots_upto<G, NB - 1, T>(nb, sh, qf, D, k, kd, wl, r, fetch);
      for (int b = 0; b < NB - 1; ++b)
        for (int j = 0; j < G; ++j) a[b][j] = r[b][j];
      return;
    }
  }
  if (sh) dots<G, NB, true>(qf, D, k, kd, wl, a, fetch);
  else dots<G, NB, false>(qf, D, k, kd, wl, a, fetch);
}

// s[j * ld + t] = scale * <q_j, key_t> + bias[t] for G queries qf [G, D] and n keys by column (key_t's d-th value
// at k[d * kd + t]), in runs of up to NB blocks (``dots``: the keys' rows read in runs, NB * G independent sums; one
// block at a time, the reads jumped between the keys' rows, and with the next task's rows fetched (``fetch``) the
// last blocks taken one at a time ran 1.07-1.2x slower than in a run). ``end``: the end of the keys' storage; a
// block may read past n (into the next row, or padding) while it stays inside it, and the lanes past n are garbage
// the caller masks; only a run's last block that would cross ``end`` is read lane by lane. ``fetch``: fetched
// during the first run's dot products, one row for each of its head_dim iterations.
template <int G, int NB, typename T>
void scores(const float* qf, int64_t D, const T* k, int64_t kd, int64_t n, const T* end, const float* bias,
            float scale, float* s, int64_t ld, const Fetch<T>& fetch) {
  const Fetch<T> none;
  for (int64_t t0 = 0; t0 < n;) {
    const int nb = static_cast<int>(std::min<int64_t>(NB, (n - t0 + W - 1) / W));
    const int64_t w = std::min<int64_t>(nb * W, n - t0);
    const bool sh = k + (D - 1) * kd + t0 + nb * W > end;
    vf a[NB][G] = {};
    dots_upto<G, NB, T>(nb, sh, qf, D, k + t0, kd, w - (nb - 1) * W, a, t0 == 0 ? fetch : none);
    for (int b = 0; b < nb; ++b) {
      const int64_t tb = t0 + b * W, wb = std::min(W, n - tb);
      const vf bv = bias ? (wb == W ? load(bias + tb) : load_n(bias + tb, wb)) : vf{};
      for (int j = 0; j < G; ++j) store(s + j * ld + tb, a[b][j] * scale + bv);  // s has W lanes of room past n
    }
    t0 += nb * W;
  }
}

// The end of a tensor's storage, as a pointer of its elements.
template <typename T> const T* storage_end(const at::Tensor& t) {
  return static_cast<const T*>(t.storage().data()) + t.storage().nbytes() / sizeof(T);
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

template <int G, typename T>
void attend(const at::Tensor& q, const at::Tensor& kp, const at::Tensor& vp, const at::Tensor& grp,
            const at::Tensor& bias, const at::Tensor& k, const at::Tensor& v, float scale, at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), P = kp.size(2), S = k.size(2);
  const int64_t C = D / W, Pr = (P + W - 1) / W * W, ld = Pr + (S + W - 1) / W * W;  // whole blocks
  const T *qd = q.data_ptr<T>(), *kpd = kp.data_ptr<T>(), *vpd = vp.data_ptr<T>();
  const T *kd = k.data_ptr<T>(), *vd = v.data_ptr<T>();
  const int64_t* gd = grp.data_ptr<int64_t>();
  const float* bd = bias.data_ptr<float>();
  T* od = out.data_ptr<T>();
  const int64_t q0 = q.stride(0), q1 = q.stride(1), q2 = q.stride(2);
  const int64_t kp0 = kp.stride(0), kp1 = kp.stride(1), kp3 = kp.stride(3);
  const int64_t vp0 = vp.stride(0), vp1 = vp.stride(1), vp2 = vp.stride(2);
  const int64_t k0 = k.stride(0), k1 = k.stride(1), k3 = k.stride(3);
  const int64_t v0 = v.stride(0), v1 = v.stride(1), v2 = v.stride(2);
  const int64_t b0 = bias.stride(0);
  const T *kp_end = storage_end<T>(kp), *k_end = storage_end<T>(k);
  constexpr int NB = G <= 2 ? 6 : G <= 4 ? 4 : 2;  // blocks a run: NB * G accumulators stay in registers
  at::parallel_for(0, B * H, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> qf(G * D), s(G * ld);
    std::vector<vf> acc(G * C);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t b = i / H, h = i % H, pg = gd[b];
      const T* qb = qd + q0 * b + q1 * h;
      for (int j = 0; j < G; ++j)
        for (int64_t d = 0; d < D; ++d) qf[j * D + d] = static_cast<float>(qb[q2 * j + d]);
      // the next task's own keys, fetched during the prompt's scores, and its values (their first head_dim rows)
      // during the own scores
      Fetch<T> next_k, next_v;
      if (i + 1 < hi) {
        const int64_t b1 = (i + 1) / H, h1 = (i + 1) % H;
        next_k = {kd + k0 * b1 + k1 * h1, k3, S, D};
        next_v = {vd + v0 * b1 + v1 * h1, v2, D, S};
      }
      scores<G, NB, T>(qf.data(), D, kpd + kp0 * pg + kp1 * h, kp3, P, kp_end, bd + b0 * pg, scale, s.data(), ld,
                       next_k);
      scores<G, NB, T>(qf.data(), D, kd + k0 * b + k1 * h, k3, S, k_end, nullptr, scale, s.data() + Pr, ld, next_v);
      float inv[G];
      for (int j = 0; j < G; ++j) {
        float* r = s.data() + j * ld;
        std::fill(r + P, r + Pr, -std::numeric_limits<float>::infinity());
        std::fill(r + Pr + S, r + ld, -std::numeric_limits<float>::infinity());
        vf mv = load(r);
        for (int64_t t0 = W; t0 < ld; t0 += W) { const vf x = load(r + t0); mv = mv > x ? mv : x; }
        float m = mv[0];
        for (int64_t l = 1; l < W; ++l) m = std::max(m, mv[l]);
        vf zv = {};
        for (int64_t t0 = 0; t0 < ld; t0 += W) { const vf e = exp_v(load(r + t0) - m); store(r + t0, e); zv += e; }
        float z = 0.f;
        for (int64_t l = 0; l < W; ++l) z += zv[l];
        inv[j] = 1.f / z;
      }
      std::fill(acc.begin(), acc.end(), vf{});
      values<G, T>(s.data(), ld, D, vpd + vp0 * pg + vp1 * h, vp2, P, acc.data());
      values<G, T>(s.data() + Pr, ld, D, vd + v0 * b + v1 * h, v2, S, acc.data());
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
void attend_g(const at::Tensor& q, const at::Tensor& kp, const at::Tensor& vp, const at::Tensor& grp,
              const at::Tensor& bias, const at::Tensor& k, const at::Tensor& v, float scale, at::Tensor& out) {
  switch (q.size(2)) {
#define RODECO_G(n) case n: return attend<n, T>(q, kp, vp, grp, bias, k, v, scale, out);
    RODECO_G(1) RODECO_G(2) RODECO_G(3) RODECO_G(4) RODECO_G(5) RODECO_G(6) RODECO_G(7) RODECO_G(8)
#undef RODECO_G
    default: TORCH_CHECK(false, "rodeco::decode_attention: at most 8 query heads a KV head, got ", q.size(2));
  }
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& kp, const at::Tensor& vp, const at::Tensor& grp,
                            const at::Tensor& bias, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 4 && kp.dim() == 4 && vp.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "rodeco::decode_attention: q, kp, vp, k, v must be 4-d");
  TORCH_CHECK(q.size(3) % LANES == 0, "rodeco::decode_attention: head_dim must be a multiple of ", LANES);
  TORCH_CHECK(q.stride(3) == 1 && vp.stride(3) == 1 && v.stride(3) == 1 && kp.stride(2) == 1 && k.stride(2) == 1,
              "rodeco::decode_attention: keys by column (token stride 1), queries and values by row");
  for (const at::Tensor* t : {&kp, &vp, &k, &v})
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "rodeco::decode_attention: q, kp, vp, k, v must share a dtype");
  TORCH_CHECK(grp.scalar_type() == at::kLong && bias.scalar_type() == at::kFloat && bias.dim() == 2 &&
              bias.stride(1) == 1, "rodeco::decode_attention: grp int64 [B], bias fp32 [G, P]");
  const int64_t B = q.size(0), G = kp.size(0);
  TORCH_CHECK(k.size(2) >= 1 && k.sizes() == v.sizes() && k.size(0) == B && kp.sizes() == vp.sizes() &&
              grp.numel() == B && bias.size(0) == G && bias.size(1) == kp.size(2) && k.size(1) == q.size(1) &&
              kp.size(1) == q.size(1) && k.size(3) == q.size(3) && kp.size(3) == q.size(3),
              "rodeco::decode_attention: shapes do not match (q [B, H, g, D], kp, vp [G, H, P, D], grp [B], "
              "bias [G, P], k, v [B, H, S >= 1, D])");
  const at::Tensor grp_c = grp.contiguous();
  const int64_t* gd = grp_c.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(gd[b] >= 0 && gd[b] < G, "rodeco::decode_attention: row ", b, " names prompt ", gd[b], " of ", G);
  at::Tensor out = at::empty(q.sizes(), q.options());
  const float sc = static_cast<float>(scale);
  switch (q.scalar_type()) {
    case at::kFloat: attend_g<float>(q, kp, vp, grp_c, bias, k, v, sc, out); break;
    case at::kBFloat16: attend_g<c10::BFloat16>(q, kp, vp, grp_c, bias, k, v, sc, out); break;
    case at::kHalf: attend_g<c10::Half>(q, kp, vp, grp_c, bias, k, v, sc, out); break;
    default: TORCH_CHECK(false, "rodeco::decode_attention: float32, bfloat16 or float16, got ", q.scalar_type());
  }
  return out;
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
  m.def("decode_attention(Tensor q, Tensor kp, Tensor vp, Tensor grp, Tensor bias, Tensor k, Tensor v, "
        "float scale) -> Tensor");
  m.def("paged_attention(Tensor q, Tensor kpool, Tensor vpool, Tensor tables, Tensor lens, Tensor starts, "
        "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(rodeco, CPU, m) {
  m.impl("decode_attention", &decode_attention);
  m.impl("paged_attention", &paged_attention);
}
