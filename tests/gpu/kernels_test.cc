// Row-wise CUDA kernels against float64 CPU references, on fresh random inputs with poisoned
// outputs. Tolerances: outputs stored as bf16 carry one rounding (relative 2^-9), so elementwise
// checks allow |err| <= 1e-2 * (1 + |ref|) and the relative L2 error must stay under 5e-3.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "gpu_worker/backend/cuda/device.h"
#include "gpu_worker/backend/cuda/gemm.h"
#include "gpu_worker/backend/cuda/launchers.h"
#include "gpu_worker/backend/cuda/ops.h"
#include "gtest/gtest.h"
#include "tests/gpu/test_util.h"

namespace cascade::cuda {
namespace {

using testing::Download;
using testing::FromBf16;
using testing::Poisoned;
using testing::RandomNormal;
using testing::RelL2;
using testing::RoundToBf16;
using testing::Upload;

void ExpectCloseBf16(const std::vector<uint16_t>& got, const std::vector<double>& ref) {
  ASSERT_EQ(got.size(), ref.size());
  std::vector<double> g(got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    g[i] = FromBf16(got[i]);
    ASSERT_FALSE(std::isnan(g[i])) << "element " << i << " not written";
    ASSERT_LE(std::fabs(g[i] - ref[i]), 1e-2 * (1 + std::fabs(ref[i]))) << "element " << i;
  }
  EXPECT_LT(RelL2(g, ref), 5e-3);
}

TEST(CudaKernels, EmbeddingGatherCopiesRowsExactly) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(1);
  const int vocab = 1000, hidden = 136, n = 37;
  std::vector<float> table = RandomNormal(vocab * hidden, &rng);
  auto table_bits = RoundToBf16(&table);
  std::vector<int32_t> ids(n);
  for (int& id : ids) id = rng() % vocab;
  DeviceBuffer d_table = Upload(table_bits), d_ids = Upload(ids);
  DeviceBuffer d_out = Poisoned<float>(n * hidden);
  ASSERT_TRUE(EmbeddingGather(d_table.as<Bf16>(), d_ids.as<int32_t>(), n, hidden, d_out.as<float>(),
                              nullptr)
                  .ok());
  auto out = Download<float>(d_out, n * hidden);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < hidden; ++c) ASSERT_EQ(out[i * hidden + c], table[ids[i] * hidden + c]);
}

TEST(CudaKernels, AddRmsNormMatchesFloat64Reference) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(2);
  for (int d : {128, 1000, 4096}) {
    for (bool with_delta : {false, true}) {
      const int n = 19;
      const float eps = 1e-6f;
      std::vector<float> res = RandomNormal(n * d, &rng, 3.f);
      std::vector<float> delta = RandomNormal(n * d, &rng);
      std::vector<float> w = RandomNormal(d, &rng, 0.1f);
      for (float& x : w) x += 1.f;
      auto delta_bits = RoundToBf16(&delta);
      auto w_bits = RoundToBf16(&w);
      DeviceBuffer d_res = Upload(res), d_delta = Upload(delta_bits), d_w = Upload(w_bits);
      DeviceBuffer d_out = Poisoned<Bf16>(n * d);
      ASSERT_TRUE(AddRmsNorm(d_res.as<float>(), with_delta ? d_delta.as<Bf16>() : nullptr,
                             d_w.as<Bf16>(), eps, n, d, d_out.as<Bf16>(), nullptr)
                      .ok());
      auto out = Download<Bf16>(d_out, n * d);
      auto new_res = Download<float>(d_res, n * d);
      std::vector<double> ref(n * d);
      for (int i = 0; i < n; ++i) {
        double ss = 0;
        std::vector<double> x(d);
        for (int c = 0; c < d; ++c) {
          x[c] = static_cast<double>(res[i * d + c]) + (with_delta ? delta[i * d + c] : 0.0);
          ASSERT_NEAR(new_res[i * d + c], x[c], 1e-6 * (1 + std::fabs(x[c])));
          ss += x[c] * x[c];
        }
        const double inv = 1.0 / std::sqrt(ss / d + eps);
        for (int c = 0; c < d; ++c) ref[i * d + c] = x[c] * inv * w[c];
      }
      ExpectCloseBf16(out, ref);
    }
  }
}

// The register-resident norm kernel (d <= 4096) and the element loop (any d) give the same bits:
// the same per-thread order of squares, the same reduction, the same products.
TEST(CudaKernels, AddRmsNormRegisterRowsMatchTheElementLoop) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(7);
  for (int d : {64, 1000, 1024, 2048, 4096}) {
    for (bool with_delta : {false, true}) {
      const int n = 9;
      std::vector<float> res = RandomNormal(n * d, &rng, 3.f);
      std::vector<float> delta = RandomNormal(n * d, &rng);
      std::vector<float> w = RandomNormal(d, &rng, 0.1f);
      auto delta_bits = RoundToBf16(&delta);
      auto w_bits = RoundToBf16(&w);
      DeviceBuffer d_delta = Upload(delta_bits), d_w = Upload(w_bits);
      std::vector<Bf16> outs[2];
      std::vector<float> residuals[2];
      for (int regs = 0; regs < 2; ++regs) {
        DeviceBuffer d_res = Upload(res);
        DeviceBuffer d_out = Poisoned<Bf16>(n * d);
        ASSERT_EQ(internal::LaunchAddRmsNorm(
                      d_res.as<float>(), with_delta ? d_delta.as<Bf16>() : nullptr, d_w.as<Bf16>(),
                      1e-6f, n, d, d_out.as<Bf16>(), nullptr, regs == 1),
                  cudaSuccess);
        outs[regs] = Download<Bf16>(d_out, n * d);
        residuals[regs] = Download<float>(d_res, n * d);
      }
      EXPECT_EQ(outs[0], outs[1]) << "d=" << d << " delta=" << with_delta;
      EXPECT_EQ(0, std::memcmp(residuals[0].data(), residuals[1].data(), n * d * sizeof(float)))
          << "d=" << d << " delta=" << with_delta;
    }
  }
}

// HF rotate_half RoPE at large global positions, after a per-head RMSNorm (Qwen3 q/k norm).
TEST(CudaKernels, QkNormRopeMatchesReferenceAtGlobalPositions) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(3);
  for (int D : {32, 64, 128}) {
    for (bool norm : {true, false}) {
      const int n = 23, hq = 4, hkv = 2, row = (hq + 2 * hkv) * D;
      const float eps = 1e-6f;
      std::vector<float> qkv = RandomNormal(n * row, &rng);
      auto qkv_bits = RoundToBf16(&qkv);
      std::vector<float> qn = RandomNormal(D, &rng, 0.1f), kn = RandomNormal(D, &rng, 0.1f);
      for (float& x : qn) x += 1.f;
      for (float& x : kn) x += 1.f;
      auto qn_bits = RoundToBf16(&qn), kn_bits = RoundToBf16(&kn);
      std::vector<int32_t> pos(n);
      for (int& p : pos) p = rng() % 40000;
      std::vector<float> inv_freq(D / 2);
      for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(1e6, -2.0 * i / D);
      DeviceBuffer d_qkv = Upload(qkv_bits), d_pos = Upload(pos), d_f = Upload(inv_freq);
      DeviceBuffer d_qn = Upload(qn_bits), d_kn = Upload(kn_bits);
      ASSERT_TRUE(QkNormRope(d_qkv.as<Bf16>(), n, row, HeadShape{hq, hkv, D}, d_pos.as<int32_t>(),
                             norm ? d_qn.as<Bf16>() : nullptr, norm ? d_kn.as<Bf16>() : nullptr,
                             eps, d_f.as<float>(), nullptr)
                      .ok());
      auto out = Download<Bf16>(d_qkv, n * row);
      std::vector<double> ref(n * row);
      for (int r = 0; r < n; ++r) {
        for (int h = 0; h < hq + 2 * hkv; ++h) {
          const float* x = &qkv[r * row + h * D];
          double* y = &ref[r * row + h * D];
          if (h >= hq + hkv) {  // v heads untouched
            for (int i = 0; i < D; ++i) y[i] = x[i];
            continue;
          }
          std::vector<double> xn(x, x + D);
          if (norm) {
            double ss = 0;
            for (double v : xn) ss += v * v;
            const double inv = 1.0 / std::sqrt(ss / D + eps);
            for (int i = 0; i < D; ++i) xn[i] *= inv * (h < hq ? qn[i] : kn[i]);
          }
          for (int i = 0; i < D / 2; ++i) {
            // The angle as HF forms it: float32 position times float32 inv_freq.
            const double a = static_cast<float>(pos[r]) * inv_freq[i];
            y[i] = xn[i] * std::cos(a) - xn[i + D / 2] * std::sin(a);
            y[i + D / 2] = xn[i + D / 2] * std::cos(a) + xn[i] * std::sin(a);
          }
        }
      }
      ExpectCloseBf16(out, ref);
      for (int r = 0; r < n; ++r)  // v heads bitwise untouched
        for (int i = (hq + hkv) * D; i < row; ++i)
          ASSERT_EQ(out[r * row + i], qkv_bits[r * row + i]);
    }
  }
}

// The fused q/k norm + RoPE + KV append writes the same bits into qkv and into the cache as
// QkNormRope followed by KvAppend (padding slots skipped, other slots untouched), for every head
// size, with and without the norm.
TEST(CudaKernels, QkNormRopeAppendEqualsTheTwoOpsBitwise) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(14);
  for (int D : {32, 64, 128, 256}) {
    for (bool norm : {true, false}) {
      const int n = 29, hq = 8, hkv = 2, bs = 16, nb = 7, row = (hq + 2 * hkv) * D;
      std::vector<float> qkv = RandomNormal(n * row, &rng);
      auto qkv_bits = RoundToBf16(&qkv);
      std::vector<float> qn = RandomNormal(D, &rng, 0.1f), kn = RandomNormal(D, &rng, 0.1f);
      auto qn_bits = RoundToBf16(&qn), kn_bits = RoundToBf16(&kn);
      std::vector<int32_t> pos(n), perm(nb * bs);
      for (int& p : pos) p = rng() % 40000;
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<int32_t> slots(perm.begin(), perm.begin() + n);
      slots[3] = slots[17] = -1;
      std::vector<float> inv_freq(D / 2);
      for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(1e6, -2.0 * i / D);
      DeviceBuffer d_pos = Upload(pos), d_f = Upload(inv_freq), d_slots = Upload(slots);
      DeviceBuffer d_qn = Upload(qn_bits), d_kn = Upload(kn_bits);
      const size_t cache_elems = static_cast<size_t>(nb) * hkv * bs * D;
      const Bf16* qw = norm ? d_qn.as<Bf16>() : nullptr;
      const Bf16* kw = norm ? d_kn.as<Bf16>() : nullptr;
      const HeadShape shape{hq, hkv, D};

      DeviceBuffer a_qkv = Upload(qkv_bits);
      DeviceBuffer a_k = Poisoned<Bf16>(cache_elems), a_v = Poisoned<Bf16>(cache_elems);
      KvCacheView a_cache{a_k.as<Bf16>(), a_v.as<Bf16>(), nb, bs, hkv, D};
      ASSERT_TRUE(QkNormRope(a_qkv.as<Bf16>(), n, row, shape, d_pos.as<int32_t>(), qw, kw, 1e-6f,
                             d_f.as<float>(), nullptr)
                      .ok());
      ASSERT_TRUE(KvAppend(a_qkv.as<Bf16>(), n, row, hq * D, (hq + hkv) * D, d_slots.as<int32_t>(),
                           a_cache, nullptr)
                      .ok());

      DeviceBuffer b_qkv = Upload(qkv_bits);
      DeviceBuffer b_k = Poisoned<Bf16>(cache_elems), b_v = Poisoned<Bf16>(cache_elems);
      KvCacheView b_cache{b_k.as<Bf16>(), b_v.as<Bf16>(), nb, bs, hkv, D};
      ASSERT_TRUE(QkNormRopeAppend(b_qkv.as<Bf16>(), n, row, shape, d_pos.as<int32_t>(), qw, kw,
                                   1e-6f, d_f.as<float>(), d_slots.as<int32_t>(), b_cache, nullptr)
                      .ok());
      EXPECT_EQ(Download<Bf16>(a_qkv, n * row), Download<Bf16>(b_qkv, n * row)) << "qkv, D " << D;
      EXPECT_EQ(Download<Bf16>(a_k, cache_elems), Download<Bf16>(b_k, cache_elems)) << "K, D " << D;
      EXPECT_EQ(Download<Bf16>(a_v, cache_elems), Download<Bf16>(b_v, cache_elems)) << "V, D " << D;
    }
  }
}

// The small-m GEMM accumulates like a non-split-K tensor-core GEMM: its rows are bitwise the
// rows the pinned cuBLASLt algorithm computes for the same inputs inside a 96-row problem (a
// prefill), for every m <= 16 and both output types. (Gemm also checks this at run time before
// using it, since it is a property of the hardware and library, not of the C++.)
TEST(CudaKernels, SmallGemmRowsEqualThePinnedGemmsRowsBitwise) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(15);
  // Unsplit: one k loop per element (split-K slices accumulate differently by design).
  auto gemm = Gemm::Create(/*batch_invariant=*/true, 256, /*small_m=*/false, /*split_k=*/1);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  for (auto [n, k] : {std::pair{256, 128}, std::pair{1024, 3072}, std::pair{4096, 1024}}) {
    for (bool f32 : {false, true}) {
      const int ref_m = 96;
      std::vector<float> x = RandomNormal(static_cast<size_t>(ref_m) * k, &rng);
      std::vector<float> w = RandomNormal(static_cast<size_t>(n) * k, &rng, 1.f / std::sqrt(k));
      DeviceBuffer d_x = Upload(RoundToBf16(&x)), d_w = Upload(RoundToBf16(&w));
      const size_t ob = f32 ? 4 : 2;
      DeviceBuffer d_ref = Poisoned<uint8_t>(ref_m * n * ob), d_y = Poisoned<uint8_t>(16 * n * ob);
      ASSERT_TRUE((*gemm)
                      ->Run(d_x.as<Bf16>(), d_w.as<Bf16>(), ref_m, n, k, d_ref.data(),
                            f32 ? GemmOut::kF32 : GemmOut::kBf16, nullptr)
                      .ok());
      const std::vector<uint8_t> want = Download<uint8_t>(d_ref, 16 * n * ob);
      for (int m = 1; m <= 16; ++m) {
        ASSERT_TRUE(
            SmallGemm(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k, d_y.data(), f32, nullptr).ok());
        const std::vector<uint8_t> got = Download<uint8_t>(d_y, m * n * ob);
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), got.size()))
            << "n " << n << " k " << k << " m " << m << (f32 ? " f32" : " bf16");
      }
    }
  }
}

// DecodeGemm (wgmma, one CTA per 8-32 features over the whole k loop) gives the pinned
// algorithm's rows bit for bit: for the projection shapes of qwen3-0.6b and llama-3.2-1b, m from
// 1 to 64 (ragged 16-row groups and 8-row atoms included), every CTA shape and stage count that
// fits, bf16 and f32 outputs; and Gemm with set_decode_max_m serves those calls through it (each
// shape verified once, none rejected). Outputs start poisoned, so an unwritten element fails.
TEST(CudaKernels, DecodeGemmRowsEqualThePinnedGemmsRowsBitwise) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(43);
  auto pinned = Gemm::Create(/*batch_invariant=*/true, 256, /*small_m=*/false);
  auto decode = Gemm::Create(/*batch_invariant=*/true, 256, /*small_m=*/false);
  ASSERT_TRUE(pinned.ok() && decode.ok());
  (*decode)->set_decode_max_m(64);
  const int rows = 96;
  for (auto [n, k] : {std::pair{4096, 1024}, std::pair{1024, 2048}, std::pair{6144, 1024},
                      std::pair{1024, 3072}, std::pair{3072, 2048}, std::pair{256, 128}}) {
    std::vector<float> x = RandomNormal(static_cast<size_t>(rows) * k, &rng);
    std::vector<float> w = RandomNormal(static_cast<size_t>(n) * k, &rng, 1.f / std::sqrt(k));
    DeviceBuffer d_x = Upload(RoundToBf16(&x)), d_w = Upload(RoundToBf16(&w));
    for (GemmOut out : {GemmOut::kBf16, GemmOut::kF32}) {
      const bool f32 = out == GemmOut::kF32;
      const size_t es = f32 ? 4 : 2;
      DeviceBuffer d_want = Poisoned<float>(static_cast<size_t>(rows) * n);
      ASSERT_TRUE((*pinned)
                      ->Run(d_x.as<Bf16>(), d_w.as<Bf16>(), rows, n, k, d_want.data(), out, nullptr)
                      .ok());
      const std::vector<uint8_t> want = Download<uint8_t>(d_want, rows * n * es);
      for (int m : {1, 2, 7, 16, 17, 31, 40, 64}) {
        const size_t bytes = static_cast<size_t>(m) * n * es;
        auto check = [&](const DeviceBuffer& d_y, const std::string& what) {
          const std::vector<uint8_t> got = Download<uint8_t>(d_y, bytes);
          EXPECT_EQ(0, std::memcmp(want.data(), got.data(), bytes))
              << what << ": n " << n << " k " << k << " m " << m << (f32 ? " f32" : " bf16");
        };
        // Weight chunks copied before the wait for the previous kernel: none, one, the default
        // two, and more than the ring's stages allow (clamped).
        const int early[] = {0, 1, 2, 99};
        int shape_index = 0;
        for (auto [cols, stages] : {std::pair{0, 0}, std::pair{8, 4}, std::pair{16, 8},
                                    std::pair{32, 4}, std::pair{8, 16}}) {
          if (cols != 0 && n % cols != 0) continue;
          const int e = early[(shape_index++ + m) % 4];
          SetDecodeGemmEarlyChunks(e);
          DeviceBuffer d_y = Poisoned<float>(static_cast<size_t>(m) * n);
          const absl::Status st = DecodeGemm(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k, d_y.data(),
                                             f32, nullptr, cols, stages);
          SetDecodeGemmEarlyChunks(2);
          if (absl::IsInvalidArgument(st)) continue;  // that CTA shape's stages do not fit
          ASSERT_TRUE(st.ok()) << st;
          check(d_y, "DecodeGemm cols " + std::to_string(cols) + " stages " +
                         std::to_string(stages) + " early chunks " + std::to_string(e));
        }
        DeviceBuffer d_y = Poisoned<float>(static_cast<size_t>(m) * n);
        ASSERT_TRUE(
            (*decode)->Run(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k, d_y.data(), out, nullptr).ok());
        check(d_y, "Gemm with set_decode_max_m(64)");
      }
    }
  }
  EXPECT_EQ((*decode)->small_rejected(), 0) << "DecodeGemm differed from the pinned algorithm";
  EXPECT_GT((*decode)->small_verified(), 0);
  EXPECT_EQ((*decode)->fallbacks(), 0);
}

// Batch-invariant split-K (gemm.h): k cut into S slices fixed per shape, partials summed in slice
// order. Every row of the result is bitwise the same whether it is computed in a call of 1..16,
// 64, 256, 1000 or 8192 rows (a decode step, a batch, a chunk of rows, a long prefill), through
// SmallGemm's split partials (m <= 2, used only once verified against cuBLASLt) or the
// strided-batched cuBLASLt call, reduced by Run (bf16 and f32 outputs, in row chunks at 8192) or
// handed out by RunPartials; and it is the product (float64 reference, bf16 tolerance). The
// same holds unsplit with the algorithms picked at another reference m (gemm_reference_m).
TEST(CudaKernels, SplitKGemmRowsAreBitwiseTheSameForEveryM) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(16);
  struct Case {
    int n, k, split_k;      // split_k 0: the built-in rule (splits these narrow shapes)
    int reference_m = 256;  // where the pinned algorithm is picked (gemm_reference_m)
  };
  // The last two: unsplit, with the algorithms cuBLASLt picks at m = 2048 (engine_bench refN).
  for (Case c : {Case{1024, 3072, 0}, Case{1024, 2048, 0}, Case{256, 512, 2}, Case{4096, 1024, 4},
                 Case{1024, 3072, 1, 2048}, Case{6144, 1024, 1, 2048}}) {
    const int n = c.n, k = c.k;
    SCOPED_TRACE(
        absl::StrCat("n ", n, " k ", k, " split_k ", c.split_k, " reference_m ", c.reference_m));
    auto gemm = Gemm::Create(/*batch_invariant=*/true, c.reference_m, /*small_m=*/true, c.split_k);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    Gemm& g = **gemm;
    const int S = g.Splits(n, k);
    if (c.split_k == 0) {
      EXPECT_GT(S, 1) << "the rule leaves n " << n << " k " << k << " unsplit";
    } else {
      EXPECT_EQ(S, c.split_k);
    }
    const int big = 8192;
    std::vector<float> x = RandomNormal(static_cast<size_t>(big) * k, &rng);
    std::vector<float> w = RandomNormal(static_cast<size_t>(n) * k, &rng, 1.f / std::sqrt(k));
    DeviceBuffer d_x = Upload(RoundToBf16(&x)), d_w = Upload(RoundToBf16(&w));
    const size_t rows_big = static_cast<size_t>(big) * n;
    DeviceBuffer d_ref = Poisoned<Bf16>(rows_big), d_ref32 = Poisoned<float>(rows_big);
    DeviceBuffer d_pref = Poisoned<float>(S * rows_big);
    ASSERT_TRUE(
        g.Run(d_x.as<Bf16>(), d_w.as<Bf16>(), big, n, k, d_ref.data(), GemmOut::kBf16, nullptr)
            .ok());
    ASSERT_TRUE(
        g.Run(d_x.as<Bf16>(), d_w.as<Bf16>(), big, n, k, d_ref32.data(), GemmOut::kF32, nullptr)
            .ok());
    ASSERT_TRUE(
        g.RunPartials(d_x.as<Bf16>(), d_w.as<Bf16>(), big, n, k, d_pref.as<float>(), nullptr).ok());
    const std::vector<uint16_t> want = Download<uint16_t>(d_ref, rows_big);
    const std::vector<float> want32 = Download<float>(d_ref32, rows_big);
    const std::vector<float> wantp = Download<float>(d_pref, S * rows_big);
    // The result is the product: rows 0..3 against float64.
    for (int r = 0; r < 4; ++r) {
      std::vector<double> ref(n);
      for (int j = 0; j < n; ++j) {
        double acc = 0;
        for (int i = 0; i < k; ++i)
          acc += double{x[r * static_cast<size_t>(k) + i]} * w[j * static_cast<size_t>(k) + i];
        ref[j] = acc;
      }
      ExpectCloseBf16(std::vector<uint16_t>(want.begin() + r * n, want.begin() + (r + 1) * n), ref);
    }
    std::vector<int> ms;
    for (int m = 1; m <= 16; ++m) ms.push_back(m);
    for (int m : {64, 256, 1000}) ms.push_back(m);
    for (int m : ms) {
      const size_t cnt = static_cast<size_t>(m) * n;
      DeviceBuffer d_y = Poisoned<Bf16>(cnt), d_y32 = Poisoned<float>(cnt);
      DeviceBuffer d_p = Poisoned<float>(S * cnt);
      ASSERT_TRUE(
          g.Run(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k, d_y.data(), GemmOut::kBf16, nullptr).ok());
      ASSERT_TRUE(
          g.Run(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k, d_y32.data(), GemmOut::kF32, nullptr)
              .ok());
      ASSERT_TRUE(
          g.RunPartials(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k, d_p.as<float>(), nullptr).ok());
      const std::vector<uint16_t> y = Download<uint16_t>(d_y, cnt);
      const std::vector<float> y32 = Download<float>(d_y32, cnt);
      const std::vector<float> p = Download<float>(d_p, S * cnt);
      EXPECT_EQ(0, std::memcmp(y.data(), want.data(), cnt * 2))
          << "n " << n << " k " << k << " m " << m << " bf16";
      EXPECT_EQ(0, std::memcmp(y32.data(), want32.data(), cnt * 4))
          << "n " << n << " k " << k << " m " << m << " f32";
      for (int s = 0; s < S; ++s) {
        EXPECT_EQ(0, std::memcmp(p.data() + s * cnt, wantp.data() + s * rows_big, cnt * 4))
            << "n " << n << " k " << k << " m " << m << " slice " << s;
      }
    }
    // DecodeGemm's split partials (grid.y = slice) directly, in several CTA shapes, and through a
    // Gemm whose decode-sized calls choose among the pinned partials, SmallGemm's and DecodeGemm's
    // (gemm.h set_decode_max_m: only a kernel whose partials were bitwise the pinned ones is used).
    if (S > 1 && k % (128 * S) == 0) {
      auto decode =
          Gemm::Create(/*batch_invariant=*/true, c.reference_m, /*small_m=*/true, c.split_k);
      ASSERT_TRUE(decode.ok()) << decode.status();
      (*decode)->set_decode_max_m(64);
      for (int m : {1, 2, 7, 16, 40, 64}) {
        const size_t cnt = static_cast<size_t>(m) * n;
        auto check_partials = [&](const DeviceBuffer& d_p, const std::string& what) {
          const std::vector<float> p = Download<float>(d_p, S * cnt);
          for (int s = 0; s < S; ++s) {
            EXPECT_EQ(0, std::memcmp(p.data() + s * cnt, wantp.data() + s * rows_big, cnt * 4))
                << what << ": m " << m << " slice " << s;
          }
        };
        for (auto [cols, stages] : {std::pair{8, 4}, std::pair{16, 8}, std::pair{32, 4}}) {
          DeviceBuffer d_p = Poisoned<float>(S * cnt);
          const absl::Status st = DecodeGemm(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k, d_p.data(),
                                             /*f32_out=*/true, nullptr, cols, stages, S);
          if (absl::IsInvalidArgument(st)) continue;  // that CTA shape's stages do not fit
          ASSERT_TRUE(st.ok()) << st;
          check_partials(d_p, absl::StrCat("DecodeGemm split cols ", cols, " stages ", stages));
        }
        DeviceBuffer d_p = Poisoned<float>(S * cnt);
        ASSERT_TRUE(
            (*decode)
                ->RunPartials(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k, d_p.as<float>(), nullptr)
                .ok());
        check_partials(d_p, "Gemm with set_decode_max_m(64)");
        DeviceBuffer d_y = Poisoned<Bf16>(cnt);
        ASSERT_TRUE(
            (*decode)
                ->Run(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k, d_y.data(), GemmOut::kBf16, nullptr)
                .ok());
        EXPECT_EQ(0, std::memcmp(Download<uint16_t>(d_y, cnt).data(), want.data(), cnt * 2))
            << "Gemm with set_decode_max_m(64), reduced: m " << m;
      }
      EXPECT_EQ((*decode)->small_rejected(), 0) << "a decode kernel's split partials differed";
      EXPECT_GT((*decode)->small_verified(), 0);
      for (const std::string& line : (*decode)->decode_log()) std::printf("%s\n", line.c_str());
    }
    // m <= 2 took the small-m kernel's partials (split shapes, or unsplit ones of n >= 3072:
    // gemm.cc SmallWins), verified bitwise at their first call.
    if (S > 1 || n >= 3072) {
      EXPECT_GT(g.small_verified(), 0);
    }
    EXPECT_EQ(g.small_rejected(), 0) << "SmallGemm's split partials differ from cuBLASLt's";
    EXPECT_EQ(g.fallbacks(), 0);
  }
}

// Tuned decode sizes (gemm.h SetTuneSizes): at a tune size the first call tunes (and returns the
// pinned result), later calls run the picked algorithm; every call's rows are bitwise the rows a
// pinned Gemm computes for the same inputs at m = 1024, for qwen3-0.6b's and llama-3.2-1b's shapes.
TEST(CudaKernels, TunedGemmGivesThePinnedRowsBitwise) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(41);
  const std::vector<std::pair<int, int>> shapes = {{4096, 1024}, {1024, 2048}, {6144, 1024},
                                                   {1024, 3072}, {3072, 2048}, {2048, 8192}};
  const std::vector<int> sizes = {8, 24, 64, 128, 256};
  absl::StatusOr<std::unique_ptr<Gemm>> pinned = Gemm::Create(true);
  absl::StatusOr<std::unique_ptr<Gemm>> tuned = Gemm::Create(true);
  ASSERT_TRUE(pinned.ok() && tuned.ok());
  (*tuned)->SetTuneSizes(sizes);
  const int rows = 1024;
  for (auto [n, k] : shapes) {
    std::vector<float> x = RandomNormal(static_cast<size_t>(rows) * k, &rng);
    std::vector<float> w = RandomNormal(static_cast<size_t>(n) * k, &rng, 0.05f);
    DeviceBuffer d_x = Upload(RoundToBf16(&x)), d_w = Upload(RoundToBf16(&w));
    for (GemmOut out : {GemmOut::kBf16, GemmOut::kF32}) {
      const size_t es = out == GemmOut::kF32 ? 4 : 2;
      DeviceBuffer d_want = Poisoned<float>(static_cast<size_t>(rows) * n);
      ASSERT_TRUE((*pinned)
                      ->Run(d_x.as<Bf16>(), d_w.as<Bf16>(), rows, n, k, d_want.data(), out, nullptr)
                      .ok());
      const std::vector<uint8_t> want = Download<uint8_t>(d_want, rows * n * es);
      for (int m : sizes) {
        for (int call = 0; call < 2; ++call) {  // the tuning call, then the tuned algorithm
          DeviceBuffer d_y = Poisoned<float>(static_cast<size_t>(m) * n);
          ASSERT_TRUE((*tuned)
                          ->Run(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k, d_y.data(), out, nullptr)
                          .ok());
          const std::vector<uint8_t> y = Download<uint8_t>(d_y, m * n * es);
          EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size()))
              << "n " << n << " k " << k << " m " << m << " call " << call << " f32 "
              << (out == GemmOut::kF32);
        }
      }
    }
  }
  int replaced = 0;
  for (const Gemm::TuneRecord& r : (*tuned)->tune_log()) {
    replaced += r.replaced;
    std::printf("tune m=%d n=%d k=%d %s: %d candidates, %d equal, pinned %.1f us, best %.1f us%s\n",
                r.m, r.n, r.k, r.f32 ? "f32" : "bf16", r.candidates, r.equal, r.pinned_us,
                r.best_us, r.replaced ? " (replaced)" : "");
  }
  EXPECT_GT((*tuned)->tune_log().size(), 0u);
  std::printf("%d of %zu tunings replaced the pinned algorithm\n", replaced,
              (*tuned)->tune_log().size());
  EXPECT_EQ((*tuned)->fallbacks(), 0);
}

// Prefill-sized calls on the algorithm PreparePrefill chose give the pinned algorithm's rows
// bitwise, at the threshold, at sizes that end mid-tile and at the largest prefill chunk; rows
// below the threshold stay on the pinned algorithm. Also with the split-K rule, whose narrow
// shapes choose among strided-batched algorithms for their partials.
class PrefillGemm : public ::testing::TestWithParam<int> {};

TEST_P(PrefillGemm, GivesThePinnedRowsBitwise) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(43);
  const std::vector<std::pair<int, int>> shapes = {
      {4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}, {3072, 2048}};
  const int min_m = 1024, rows = 8192 + 40;
  const int split_k = GetParam();
  absl::StatusOr<std::unique_ptr<Gemm>> pinned = Gemm::Create(true, 256, true, split_k);
  absl::StatusOr<std::unique_ptr<Gemm>> chosen = Gemm::Create(true, 256, true, split_k);
  ASSERT_TRUE(pinned.ok() && chosen.ok());
  if (split_k == 0) EXPECT_GT((*chosen)->Splits(1024, 2048), 1);
  (*chosen)->set_prefill_min_m(min_m);
  for (auto [n, k] : shapes) {
    std::vector<float> x = RandomNormal(static_cast<size_t>(rows) * k, &rng);
    std::vector<float> w = RandomNormal(static_cast<size_t>(n) * k, &rng, 0.05f);
    DeviceBuffer d_x = Upload(RoundToBf16(&x)), d_w = Upload(RoundToBf16(&w));
    ASSERT_TRUE((*chosen)->PreparePrefill(d_w.as<Bf16>(), n, k, GemmOut::kBf16, nullptr).ok());
    // The pinned rows, computed 256 at a time (the reference m).
    DeviceBuffer d_want = Poisoned<Bf16>(static_cast<size_t>(rows) * n);
    for (int r0 = 0; r0 < rows; r0 += 256) {
      const int m = std::min(256, rows - r0);
      ASSERT_TRUE((*pinned)
                      ->Run(d_x.as<Bf16>() + static_cast<size_t>(r0) * k, d_w.as<Bf16>(), m, n, k,
                            d_want.as<Bf16>() + static_cast<size_t>(r0) * n, GemmOut::kBf16,
                            nullptr)
                      .ok());
    }
    const std::vector<Bf16> want = Download<Bf16>(d_want, static_cast<size_t>(rows) * n);
    for (int m : {min_m - 1, min_m, min_m + 57, 3000, 4096 + 8, rows}) {
      DeviceBuffer d_y = Poisoned<Bf16>(static_cast<size_t>(m) * n);
      ASSERT_TRUE(
          (*chosen)
              ->Run(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k, d_y.data(), GemmOut::kBf16, nullptr)
              .ok());
      const std::vector<Bf16> y = Download<Bf16>(d_y, static_cast<size_t>(m) * n);
      EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(Bf16)))
          << "n " << n << " k " << k << " m " << m;
    }
  }
  int replaced = 0;
  for (const Gemm::TuneRecord& r : (*chosen)->prefill_log()) {
    replaced += r.replaced;
    std::printf(
        "prefill n=%d k=%d: %d candidates, %d equal, pinned %.1f us (%s), best %.1f us "
        "(%s)%s\n",
        r.n, r.k, r.candidates, r.equal, r.pinned_us, r.pinned_algo.c_str(), r.best_us,
        r.best_algo.c_str(), r.replaced ? " (replaced)" : "");
  }
  EXPECT_EQ((*chosen)->prefill_log().size(), shapes.size());
  std::printf("%d of %zu prefill shapes replaced the pinned algorithm\n", replaced,
              (*chosen)->prefill_log().size());
  EXPECT_EQ((*chosen)->fallbacks(), 0);
}

INSTANTIATE_TEST_SUITE_P(CudaKernels, PrefillGemm, ::testing::Values(1, 0),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return i.param == 1 ? std::string("Unsplit") : std::string("SplitRule");
                         });

// The fused norm's delta is the bf16 rounding of the slice-order sum: bitwise SplitReduce to bf16
// followed by AddRmsNorm (residual and output).
TEST(CudaKernels, AddRmsNormSplitIsSplitReduceThenAddRmsNorm) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(17);
  for (int S : {2, 3, 4, 8}) {
    const int n = 37, d = 1024;
    std::vector<float> res = RandomNormal(static_cast<size_t>(n) * d, &rng);
    std::vector<float> part = RandomNormal(static_cast<size_t>(S) * n * d, &rng, 0.3f);
    std::vector<float> wt = RandomNormal(d, &rng);
    DeviceBuffer d_part = Upload(part), d_w = Upload(RoundToBf16(&wt));
    DeviceBuffer d_ra = Upload(res), d_rb = Upload(res);
    DeviceBuffer d_delta = Poisoned<Bf16>(n * d);
    DeviceBuffer d_oa = Poisoned<Bf16>(n * d), d_ob = Poisoned<Bf16>(n * d);
    ASSERT_TRUE(SplitReduce(d_part.as<float>(), S, n, d, d_delta.data(), false, nullptr).ok());
    ASSERT_TRUE(AddRmsNorm(d_ra.as<float>(), d_delta.as<Bf16>(), d_w.as<Bf16>(), 1e-6f, n, d,
                           d_oa.as<Bf16>(), nullptr)
                    .ok());
    ASSERT_TRUE(AddRmsNormSplit(d_rb.as<float>(), d_part.as<float>(), S, d_w.as<Bf16>(), 1e-6f, n,
                                d, d_ob.as<Bf16>(), nullptr)
                    .ok());
    EXPECT_EQ(Download<float>(d_ra, n * d), Download<float>(d_rb, n * d)) << "residual, S " << S;
    EXPECT_EQ(Download<uint16_t>(d_oa, n * d), Download<uint16_t>(d_ob, n * d)) << "out, S " << S;
    // And SplitReduce sums in slice order in fp32.
    const std::vector<uint16_t> delta = Download<uint16_t>(d_delta, n * d);
    for (size_t i = 0; i < static_cast<size_t>(n) * d; i += 97) {
      float s = part[i];
      for (int j = 1; j < S; ++j) s += part[j * static_cast<size_t>(n) * d + i];
      ASSERT_EQ(delta[i], testing::ToBf16(s)) << "element " << i << ", S " << S;
    }
  }
}

TEST(CudaKernels, KvAppendWritesExactlyTheMappedSlots) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(4);
  const int D = 64, hq = 4, hkv = 2, bs = 16, nb = 9, n = 20, row = (hq + 2 * hkv) * D;
  std::vector<float> qkv = RandomNormal(n * row, &rng);
  auto qkv_bits = RoundToBf16(&qkv);
  std::vector<int32_t> perm(nb * bs);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> slots(perm.begin(), perm.begin() + n);
  slots[5] = -1;  // padding token: skipped
  DeviceBuffer d_qkv = Upload(qkv_bits), d_slots = Upload(slots);
  const size_t cache_elems = static_cast<size_t>(nb) * hkv * bs * D;
  DeviceBuffer d_k = Poisoned<Bf16>(cache_elems), d_v = Poisoned<Bf16>(cache_elems);
  KvCacheView cache{d_k.as<Bf16>(), d_v.as<Bf16>(), nb, bs, hkv, D};
  ASSERT_TRUE(KvAppend(d_qkv.as<Bf16>(), n, row, hq * D, (hq + hkv) * D, d_slots.as<int32_t>(),
                       cache, nullptr)
                  .ok());
  auto k = Download<Bf16>(d_k, cache_elems), v = Download<Bf16>(d_v, cache_elems);
  std::vector<bool> written(cache_elems, false);
  for (int r = 0; r < n; ++r) {
    if (slots[r] < 0) continue;
    const int blk = slots[r] / bs, off = slots[r] % bs;
    for (int h = 0; h < hkv; ++h)
      for (int d = 0; d < D; ++d) {
        const size_t i = ((static_cast<size_t>(blk) * hkv + h) * bs + off) * D + d;
        ASSERT_EQ(k[i], qkv_bits[r * row + hq * D + h * D + d]);
        ASSERT_EQ(v[i], qkv_bits[r * row + (hq + hkv) * D + h * D + d]);
        written[i] = true;
      }
  }
  for (size_t i = 0; i < cache_elems; ++i) {
    if (!written[i]) {
      ASSERT_EQ(k[i], 0xFFFF) << "slot element " << i << " was overwritten";
    }
  }
}

TEST(CudaKernels, SiluMulMatchesReference) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(5);
  const int n = 13, inter = 384;
  std::vector<float> gu = RandomNormal(n * 2 * inter, &rng, 2.f);
  auto gu_bits = RoundToBf16(&gu);
  DeviceBuffer d_gu = Upload(gu_bits), d_out = Poisoned<Bf16>(n * inter);
  ASSERT_TRUE(SiluMul(d_gu.as<Bf16>(), n, inter, d_out.as<Bf16>(), nullptr).ok());
  std::vector<double> ref(n * inter);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < inter; ++c) {  // gate c at column c / 8 * 16 + c % 8, up 8 columns on
      const int gc = c / 8 * 16 + c % 8;
      const double g = gu[r * 2 * inter + gc], u = gu[r * 2 * inter + gc + 8];
      ref[r * inter + c] = g / (1 + std::exp(-g)) * u;
    }
  ExpectCloseBf16(Download<Bf16>(d_out, n * inter), ref);
  EXPECT_EQ(SiluMul(d_gu.as<Bf16>(), n, 12, d_out.as<Bf16>(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // inter not a multiple of 8
  EXPECT_EQ(SiluMul(d_gu.as<Bf16>() + 1, n, inter, d_out.as<Bf16>(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // not 16-byte aligned
}

// More rows than a grid's y dimension holds (65535): the rows past it are strided onto the same
// CTAs and every one is written.
TEST(CudaKernels, SiluMulCoversMoreRowsThanOneGridDimension) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(6);
  const int n = 65535 + 37, inter = 16;
  std::vector<float> gu = RandomNormal(n * 2 * inter, &rng, 2.f);
  auto gu_bits = RoundToBf16(&gu);
  DeviceBuffer d_gu = Upload(gu_bits), d_out = Poisoned<Bf16>(n * inter);
  ASSERT_TRUE(SiluMul(d_gu.as<Bf16>(), n, inter, d_out.as<Bf16>(), nullptr).ok());
  std::vector<double> ref(static_cast<size_t>(n) * inter);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < inter; ++c) {
      const int gc = c / 8 * 16 + c % 8;
      const double g = gu[r * 2 * inter + gc], u = gu[r * 2 * inter + gc + 8];
      ref[static_cast<size_t>(r) * inter + c] = g / (1 + std::exp(-g)) * u;
    }
  ExpectCloseBf16(Download<Bf16>(d_out, n * inter), ref);
}

// DecodeGemm with SiluMul in its epilogue stores bitwise what DecodeGemm to bf16 then SiluMul
// store (every m 1..64 shape class, 16 and 32 features per CTA, every stage count, both ends of
// the early weight copies), and refuses a CTA of 8 features (no room for a gate/up pair).
TEST(CudaKernels, DecodeGemmSiluMulEqualsDecodeGemmThenSiluMulBitwise) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(61);
  const int rows = 64;
  for (auto [inter, k] : {std::pair{3072, 1024}, std::pair{384, 2048}}) {
    const int n = 2 * inter;
    std::vector<float> x = RandomNormal(static_cast<size_t>(rows) * k, &rng);
    std::vector<float> w = RandomNormal(static_cast<size_t>(n) * k, &rng, 1.f / std::sqrt(k));
    DeviceBuffer d_x = Upload(RoundToBf16(&x)), d_w = Upload(RoundToBf16(&w));
    for (int m : {1, 3, 16, 29, 64}) {
      for (auto [cols, stages] : {std::pair{16, 8}, std::pair{32, 4}, std::pair{32, 16}}) {
        DeviceBuffer d_gu = Poisoned<Bf16>(static_cast<size_t>(m) * n);
        DeviceBuffer d_want = Poisoned<Bf16>(static_cast<size_t>(m) * inter);
        DeviceBuffer d_got = Poisoned<Bf16>(static_cast<size_t>(m) * inter);
        const absl::Status plain = DecodeGemm(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k, d_gu.data(),
                                              false, nullptr, cols, stages);
        if (absl::IsInvalidArgument(plain)) continue;  // those stages do not fit at this m
        ASSERT_TRUE(plain.ok()) << plain;
        ASSERT_TRUE(SiluMul(d_gu.as<Bf16>(), m, inter, d_want.as<Bf16>(), nullptr).ok());
        SetDecodeGemmEarlyChunks(m % 2 == 0 ? 0 : 99);
        const absl::Status st = DecodeGemmSiluMul(d_x.as<Bf16>(), d_w.as<Bf16>(), m, n, k,
                                                  d_got.as<Bf16>(), nullptr, cols, stages);
        SetDecodeGemmEarlyChunks(2);
        ASSERT_TRUE(st.ok()) << st;
        const std::vector<Bf16> want = Download<Bf16>(d_want, static_cast<size_t>(m) * inter);
        const std::vector<Bf16> got = Download<Bf16>(d_got, static_cast<size_t>(m) * inter);
        EXPECT_EQ(want, got) << "inter " << inter << " k " << k << " m " << m << " cols " << cols
                             << " stages " << stages;
      }
    }
    DeviceBuffer d_act = Poisoned<Bf16>(static_cast<size_t>(rows) * inter);
    EXPECT_EQ(
        DecodeGemmSiluMul(d_x.as<Bf16>(), d_w.as<Bf16>(), 4, n, k, d_act.as<Bf16>(), nullptr, 8, 8)
            .code(),
        absl::StatusCode::kInvalidArgument);
  }
}

TEST(CudaKernels, ArgmaxPicksLowestIndexAmongTiesAndIgnoresNaN) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(6);
  const int n = 5, vocab = 151936;
  std::vector<float> logits = RandomNormal(n * vocab, &rng);
  logits[0 * vocab + 7] = 50.f;
  logits[0 * vocab + 9000] = 50.f;  // tie: index 7 wins
  logits[1 * vocab + 3] = NAN;      // NaN never wins
  logits[1 * vocab + 151935] = 40.f;
  DeviceBuffer d_l = Upload(logits), d_out = Poisoned<int32_t>(n);
  ASSERT_TRUE(ArgmaxRows(d_l.as<float>(), n, vocab, d_out.as<int32_t>(), nullptr).ok());
  auto out = Download<int32_t>(d_out, n);
  for (int r = 0; r < n; ++r) {
    int best = 0;
    for (int c = 1; c < vocab; ++c)
      if (logits[r * vocab + c] > logits[r * vocab + best] || std::isnan(logits[r * vocab + best]))
        best = c;
    EXPECT_EQ(out[r], best) << "row " << r;
  }
  EXPECT_EQ(out[0], 7);
  EXPECT_EQ(out[1], 151935);
}

TEST(CudaKernels, OpsRejectBadShapes) {
  EXPECT_EQ(AddRmsNorm(nullptr, nullptr, nullptr, 1e-6f, 1, 0, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QkNormRope(nullptr, 1, 8, HeadShape{1, 1, 48}, nullptr, nullptr, nullptr, 1e-6f,
                       nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  KvCacheView cache{nullptr, nullptr, 1, 16, 1, 64};
  EXPECT_EQ(KvAppend(nullptr, 1, 100, 0, 0, nullptr, cache, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// PrefetchL2 only hints the cache: it must accept every 16-byte multiple (pieces that do not fill
// its 32 KB step, several regions, more threads than pieces), leave the data as it was, and refuse
// what the bulk prefetch instruction cannot take.
TEST(CudaKernels, PrefetchL2RunsOnAnySizeAndRefusesMisalignedRegions) {
  CASCADE_REQUIRE_GPU();
  const size_t bytes = (size_t{5} << 20) + 48;
  std::vector<uint8_t> h(bytes);
  for (size_t i = 0; i < bytes; ++i) h[i] = static_cast<uint8_t>(i * 131 + 7);
  auto buf = DeviceBuffer::Allocate(bytes);
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_TRUE(CopyToDevice(buf->data(), h.data(), bytes).ok());
  const auto* p = buf->as<uint8_t>();
  L2Regions r;
  r.count = 3;
  r.data[0] = p;
  r.bytes[0] = bytes;
  r.data[1] = p + 4096;
  r.bytes[1] = 16;
  r.data[2] = p + 16;
  r.bytes[2] = 0;  // empty: skipped
  for (int ctas : {1, 16, 1024}) {
    ASSERT_TRUE(PrefetchL2(r, ctas, nullptr).ok()) << ctas;
  }
  ASSERT_TRUE(Synchronize(nullptr).ok());
  std::vector<uint8_t> back(bytes);
  ASSERT_TRUE(CopyToHost(back.data(), buf->data(), bytes).ok());
  EXPECT_EQ(back, h);

  L2Regions bad = r;
  bad.data[0] = p + 8;
  EXPECT_EQ(PrefetchL2(bad, 16, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad = r;
  bad.bytes[1] = 40;
  EXPECT_EQ(PrefetchL2(bad, 16, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad = r;
  bad.count = kMaxL2Regions + 1;
  EXPECT_EQ(PrefetchL2(bad, 16, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrefetchL2(r, 0, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cascade::cuda
