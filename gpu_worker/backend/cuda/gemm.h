// bf16 GEMMs through cuBLASLt: y[m, n] = x[m, k] * w[n, k]^T (a Hugging Face Linear), fp32
// accumulation, bf16 or f32 output.
//
// Batch invariance: cuBLAS picks kernels (tile shapes, split-K) by the problem size, so the same
// row can round differently at m = 1 and m = 300. With `batch_invariant`, one algorithm is chosen
// per (n, k, output type) at a reference m, with split-K off (reduction scheme NONE, one split),
// and reused for every m: each output element is then the same k-loop over the same data whatever
// else is in the batch. If cuBLASLt rejects the pinned algorithm for some m, that call falls back
// to the heuristic's choice and fallbacks() counts it (invariance is then not guaranteed).
//
// Decode-sized m: the pinned algorithm (a large-tile kernel chosen for m = 256) streams the
// weights far below bandwidth at m <= 16. With `small_m`, the calls where SmallGemm measured
// faster (m <= 2 with n >= 3072, and n >= 65536 up to m = 16: gemm.cc) go to SmallGemm (ops.h), one
// fp32 accumulator per element over k ascending in m16n8k16 tensor-core steps -- the same
// accumulation a non-split-K tensor-core GEMM does. It is used for a shape (n, k, output type)
// only after its first call compared its output bitwise with the pinned algorithm's on the same
// data (outside graph capture); a shape that differs stays on cuBLASLt (small_rejected()).
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
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(bool batch_invariant, int reference_m = 256,
                                                      bool small_m = true);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // x: [m, k] bf16, w: [n, k] bf16, y: [m, n] bf16 or f32, all dense row-major.
  // REQUIRES: k and n multiples of 8, 16-byte aligned pointers (checked).
  // Not thread-safe (caches algorithms).
  absl::Status Run(const Bf16* x, const Bf16* w, int m, int n, int k, void* y, GemmOut out,
                   Stream stream);

  int64_t fallbacks() const { return fallbacks_; }
  // Shapes verified bitwise and served by SmallGemm at m <= kSmallM; shapes that differed.
  int small_verified() const { return small_verified_; }
  int small_rejected() const { return small_rejected_; }
  static constexpr int kSmallM = 16;

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
  bool small_m_ = true;
  std::map<std::tuple<int, int, int>, bool> small_ok_;  // (n, k, out) -> verified equal
  int small_verified_ = 0, small_rejected_ = 0;
};

}  // namespace cascade::cuda
