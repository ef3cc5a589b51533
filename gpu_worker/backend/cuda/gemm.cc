// cuBLASLt GEMM with pinned (batch-invariant) or per-size algorithms; see gemm.h.
#include "gpu_worker/backend/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace cascade::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32 << 20;

absl::Status LtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLASLt ", what, ": ", cublasGetStatusString(s)));
}

// Column-major view of the row-major problem: Y^T[n, m] = W[k, n]^T * X^T[k, m].
struct Problem {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Problem() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
  absl::Status Init(int m, int n, int k, GemmOut out) {
    if (auto s = LtStatus(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
        !s.ok()) {
      return s;
    }
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    const cudaDataType_t ct = out == GemmOut::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
    if (auto s = LtStatus(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, k), "layout A");
        !s.ok()) {
      return s;
    }
    if (auto s = LtStatus(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, m, k), "layout B");
        !s.ok()) {
      return s;
    }
    return LtStatus(cublasLtMatrixLayoutCreate(&c, ct, n, m, n), "layout C");
  }
};

// Where SmallGemm beats the pinned algorithm (cuda_gemm_bench, H200: it streams big weight
// matrices faster at m = 1-2, and vocabulary-sized ones (the LM head) up to m = 16; for narrow
// outputs such as o_proj and down_proj at 0.6B, n = 1024, the pinned kernel is faster). Both give
// the same bits, so this is only a speed choice.
bool SmallWins(int m, int n) { return m <= Gemm::kSmallM && (n >= 65536 || (m <= 2 && n >= 3072)); }

}  // namespace

struct Gemm::Algo {
  cublasLtMatmulAlgo_t algo;
};

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(bool batch_invariant, int reference_m,
                                                   bool small_m) {
  std::unique_ptr<Gemm> g(new Gemm());
  g->batch_invariant_ = batch_invariant;
  g->small_m_ = batch_invariant && small_m;
  g->reference_m_ = reference_m;
  cublasLtHandle_t h;
  if (auto s = LtStatus(cublasLtCreate(&h), "create"); !s.ok()) return s;
  g->handle_ = h;
  absl::StatusOr<DeviceBuffer> ws = DeviceBuffer::Allocate(kWorkspaceBytes);
  if (!ws.ok()) return ws.status();
  g->workspace_ = std::move(*ws);
  return g;
}

Gemm::~Gemm() {
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

absl::StatusOr<const Gemm::Algo*> Gemm::FindAlgo(int m, int n, int k, GemmOut out) {
  const auto key = std::make_tuple(m, n, k, static_cast<int>(out));
  if (auto it = algos_.find(key); it != algos_.end()) return it->second.get();
  Problem p;
  if (auto s = p.Init(m, n, k, out); !s.ok()) return s;
  cublasLtMatmulPreference_t pref;
  if (auto s = LtStatus(cublasLtMatmulPreferenceCreate(&pref), "preference"); !s.ok()) return s;
  const uint64_t ws = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  if (batch_invariant_) {
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                         sizeof(mask));
  }
  cublasLtMatmulHeuristicResult_t result[8];
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p.desc,
                                                     p.a, p.b, p.c, p.c, pref, 8, result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (auto s = LtStatus(st, "heuristic"); !s.ok()) return s;
  if (found == 0) {
    return absl::InternalError(
        absl::StrCat("cuBLASLt: no algorithm for m=", m, " n=", n, " k=", k));
  }
  auto algo = std::make_unique<Algo>();
  algo->algo = result[0].algo;
  if (batch_invariant_) {
    const int32_t one = 1;
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulAlgoConfigSetAttribute(&algo->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one,
                                         sizeof(one));
    cublasLtMatmulAlgoConfigSetAttribute(&algo->algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none,
                                         sizeof(none));
  }
  const Algo* raw = algo.get();
  algos_.emplace(key, std::move(algo));
  return raw;
}

absl::Status Gemm::Run(const Bf16* x, const Bf16* w, int m, int n, int k, void* y, GemmOut out,
                       Stream stream) {
  if (m < 0 || n <= 0 || k <= 0 || n % 8 || k % 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gemm: bad shape m=", m, " n=", n, " k=", k, " (n, k multiples of 8)"));
  }
  if (m == 0) return absl::OkStatus();
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(x) || !aligned(w) || !aligned(y)) {
    return absl::InvalidArgumentError("Gemm: pointers must be 16-byte aligned");
  }
  if (small_m_ && SmallWins(m, n) && k % 64 == 0) {
    const auto key = std::make_tuple(n, k, static_cast<int>(out));
    auto it = small_ok_.find(key);
    if (it != small_ok_.end() && it->second) {
      return SmallGemm(x, w, m, n, k, y, out == GemmOut::kF32, stream);
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (it == small_ok_.end() && cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
        capture == cudaStreamCaptureStatusNone) {
      // First call of this shape: both paths on the same data, compared bit for bit.
      const size_t bytes = static_cast<size_t>(m) * n * (out == GemmOut::kF32 ? 4 : 2);
      absl::StatusOr<DeviceBuffer> ref = DeviceBuffer::Allocate(bytes);
      if (!ref.ok()) return ref.status();
      small_m_ = false;  // the reference below runs the pinned algorithm
      absl::Status st = Run(x, w, m, n, k, ref->data(), out, stream);
      small_m_ = true;
      if (!st.ok()) return st;
      if (st = SmallGemm(x, w, m, n, k, y, out == GemmOut::kF32, stream); !st.ok()) return st;
      std::vector<uint8_t> a(bytes), b(bytes);
      if (st = Synchronize(stream); !st.ok()) return st;
      if (st = CopyToHost(a.data(), ref->data(), bytes); !st.ok()) return st;
      if (st = CopyToHost(b.data(), y, bytes); !st.ok()) return st;
      const bool equal = std::memcmp(a.data(), b.data(), bytes) == 0;
      small_ok_[key] = equal;
      ++(equal ? small_verified_ : small_rejected_);
      if (equal) return absl::OkStatus();
      return CopyAsync(y, ref->data(), bytes, stream);  // the pinned algorithm's result stands
    }
  }
  Problem p;
  if (auto s = p.Init(m, n, k, out); !s.ok()) return s;
  const auto handle = static_cast<cublasLtHandle_t>(handle_);
  const Algo* algo = nullptr;
  if (batch_invariant_) {
    absl::StatusOr<const Algo*> pinned = FindAlgo(reference_m_, n, k, out);
    if (!pinned.ok()) return pinned.status();
    const auto ck = std::make_tuple(m, n, k, static_cast<int>(out));
    bool ok = checked_.count(ck) > 0;
    if (!ok) {
      cublasLtMatmulHeuristicResult_t r;
      ok = cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.c, p.c, &(*pinned)->algo, &r) ==
               CUBLAS_STATUS_SUCCESS &&
           r.workspaceSize <= kWorkspaceBytes;
      if (ok) checked_.insert(ck);
    }
    if (ok) {
      algo = *pinned;
    } else {
      ++fallbacks_;
    }
  }
  if (algo == nullptr) {
    absl::StatusOr<const Algo*> a = FindAlgo(m, n, k, out);
    if (!a.ok()) return a.status();
    algo = *a;
  }
  const float alpha = 1.f, beta = 0.f;
  return LtStatus(cublasLtMatmul(handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c,
                                 &algo->algo, workspace_.data(), kWorkspaceBytes, stream),
                  "matmul");
}

}  // namespace cascade::cuda
