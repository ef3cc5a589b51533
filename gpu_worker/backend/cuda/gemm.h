// bf16 GEMMs through cuBLASLt: y[m, n] = x[m, k] * w[n, k]^T (a Hugging Face Linear), fp32
// accumulation, bf16 or f32 output.
//
// Batch invariance: cuBLAS picks kernels (tile shapes, split-K) by the problem size, so the same
// row can round differently at m = 1 and m = 300. With `batch_invariant`, one algorithm is chosen
// per (n, k, output type) at a reference m, with split-K off (reduction scheme NONE, one split),
// and reused for every m: each output element is then the same k-loop over the same data whatever
// else is in the batch. If cuBLASLt rejects the pinned algorithm for some m, that call falls back
// to the heuristic's choice and fallbacks() counts it (invariance is then not guaranteed).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/backend/cuda/device.h"
#include "gpu_worker/backend/cuda/ops.h"

namespace cascade::cuda {

enum class GemmOut { kBf16, kF32 };

class Gemm {
 public:
  // reference_m: the m at which pinned algorithms are chosen.
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(bool batch_invariant, int reference_m = 256);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // x: [m, k] bf16, w: [n, k] bf16, y: [m, n] bf16 or f32, all dense row-major.
  // REQUIRES: k and n multiples of 8, 16-byte aligned pointers (checked).
  // Not thread-safe (caches algorithms).
  absl::Status Run(const Bf16* x, const Bf16* w, int m, int n, int k, void* y, GemmOut out,
                   Stream stream);

  int64_t fallbacks() const { return fallbacks_; }

 private:
  struct Algo;
  Gemm() = default;
  absl::StatusOr<const Algo*> FindAlgo(int m, int n, int k, GemmOut out);

  bool batch_invariant_ = true;
  int reference_m_ = 256;
  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer workspace_;
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<Algo>> algos_;  // (m or -1, n, k, out)
  std::set<std::tuple<int, int, int, int>> checked_;  // (m, n, k, out) verified for a pinned algo
  int64_t fallbacks_ = 0;
};

}  // namespace cascade::cuda
