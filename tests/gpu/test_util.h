// Helpers for the GPU tests: skipping without a device, host bf16, random data, device copies.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gpu_worker/backend/cuda/device.h"
#include "gtest/gtest.h"

namespace cascade::cuda::testing {

// Skips the current test when there is no CUDA device (CI compiles these tests on machines
// without a GPU; ctest then reports them as skipped).
#define CASCADE_REQUIRE_GPU()                                                                     \
  do {                                                                                            \
    if (::cascade::cuda::DeviceCount() == 0) {                                                    \
      GTEST_SKIP() << "no CUDA device: GPU test skipped (run on a GPU machine, see docs/GPU.md)"; \
    }                                                                                             \
  } while (0)

uint16_t ToBf16(float f);
float FromBf16(uint16_t b);
// Rounds every value to bf16 precision (returns the bf16 bits and overwrites `v` with the
// rounded floats, so references see exactly what the device sees).
std::vector<uint16_t> RoundToBf16(std::vector<float>* v);
std::vector<float> RandomNormal(size_t n, std::mt19937* rng, float stddev = 1.f);

// Relative L2 error ||a - b|| / ||b||, and the largest |a - b|.
double RelL2(const std::vector<double>& a, const std::vector<double>& b);
double MaxAbs(const std::vector<double>& a, const std::vector<double>& b);

// Device copy of a host vector (fails the test on error).
template <typename T>
DeviceBuffer Upload(const std::vector<T>& v) {
  absl::StatusOr<DeviceBuffer> b =
      DeviceBuffer::Allocate(std::max<size_t>(1, v.size()) * sizeof(T));
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(CopyToDevice(b->data(), v.data(), v.size() * sizeof(T)).ok());
  return std::move(*b);
}
// A device buffer of n elements filled with the byte 0xFF (bf16 NaN, f32 NaN, int32 -1): outputs
// are poisoned so an element the kernel forgets to write shows up.
template <typename T>
DeviceBuffer Poisoned(size_t n) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(std::max<size_t>(1, n) * sizeof(T));
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(FillBytes(b->data(), 0xFF, n * sizeof(T)).ok());
  return std::move(*b);
}
template <typename T>
std::vector<T> Download(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  EXPECT_TRUE(Synchronize(nullptr).ok());
  EXPECT_TRUE(CopyToHost(v.data(), b.data(), n * sizeof(T)).ok());
  return v;
}

}  // namespace cascade::cuda::testing
