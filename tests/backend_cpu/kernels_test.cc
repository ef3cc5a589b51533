// CPU kernels: the matmul's tiled paths equal the plain fixed-order Dot() bitwise for any row
// count, column range and length (the basis of batch invariance); bf16 weights widened on the
// fly equal float32 weights bitwise; the thread pool covers every index exactly once.
#include "gpu_worker/backend/cpu/kernels.h"

#include <atomic>
#include <cstring>
#include <random>

#include "gpu_worker/backend/cpu/thread_pool.h"
#include "gpu_worker/model/safetensors.h"
#include "gtest/gtest.h"

namespace cascade::cpu {
namespace {

TEST(KernelsTest, MatMulEqualsPerElementDotBitwiseForAnyShapeAndRange) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  for (int64_t k : {1, 7, 8, 13, 64, 131}) {
    const int64_t rows = 5, n = 23;
    std::vector<float> x(rows * k), w(n * k);
    for (float& v : x) v = dist(rng);
    std::vector<uint16_t> wb(n * k);
    for (size_t i = 0; i < w.size(); ++i) {
      wb[i] = model::FloatToBf16(dist(rng));
      w[i] = model::Bf16ToFloat(wb[i]);
    }
    // Full range, and split at an odd column with a single row.
    std::vector<float> y(rows * n, -1), yb(rows * n, -2), y1(n, -3);
    MatMulRange(x.data(), rows, k, w.data(), 0, n, y.data(), n);
    MatMulRangeBf16(x.data(), rows, k, wb.data(), 0, n, yb.data(), n);
    MatMulRange(x.data() + 3 * k, 1, k, w.data(), 0, 9, y1.data(), n);
    MatMulRange(x.data() + 3 * k, 1, k, w.data(), 9, n, y1.data(), n);
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t j = 0; j < n; ++j) {
        const float want = Dot(x.data() + t * k, w.data() + j * k, k);
        ASSERT_EQ(std::memcmp(&y[t * n + j], &want, 4), 0) << k << " " << t << " " << j;
        ASSERT_EQ(std::memcmp(&yb[t * n + j], &want, 4), 0) << k << " " << t << " " << j;
        if (t == 3) {
          ASSERT_EQ(std::memcmp(&y1[j], &want, 4), 0) << k << " " << j;
        }
        double ref = 0;
        for (int64_t i = 0; i < k; ++i) ref += double{x[t * k + i]} * w[j * k + i];
        EXPECT_NEAR(want, ref, 1e-4 * (1 + std::abs(ref)));
      }
    }
  }
}

TEST(KernelsTest, RopeRotatesPairsHalfADimensionApart) {
  float x[4] = {1, 2, 3, 4};
  const float cos[2] = {0, 1}, sin[2] = {1, 0};
  ApplyRope(x, cos, sin, 4);
  // Pair (0, 2) rotated by 90 degrees, pair (1, 3) by 0.
  EXPECT_FLOAT_EQ(x[0], -3);
  EXPECT_FLOAT_EQ(x[2], 1);
  EXPECT_FLOAT_EQ(x[1], 2);
  EXPECT_FLOAT_EQ(x[3], 4);
}

TEST(ThreadPoolTest, ParallelForCoversEachIndexOnceInGrainAlignedParts) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 7, 16, 100, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, 4, [&](int64_t b, int64_t e) {
        EXPECT_EQ(b % 4, 0);
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
  }
}

}  // namespace
}  // namespace cascade::cpu
