// cuBLASLt GEMM with pinned (batch-invariant) or per-size algorithms; see gemm.h.
#include "gpu_worker/backend/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_worker/backend/cuda/status_macros.h"
#include "gpu_worker/model/safetensors.h"

namespace cascade::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32 << 20;
// Run()'s fp32 partials of split shapes: [S, rows, n] per row chunk.
constexpr size_t kSplitWorkspaceBytes = 64 << 20;

absl::Status LtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLASLt ", what, ": ", cublasGetStatusString(s)));
}

// Column-major view of the row-major problem: Y^T[n, m] = W[k, n]^T * X^T[k, m]. With S > 1
// slices, a strided batch of S problems: batch s reads k columns [s ks, (s + 1) ks) of W and X
// (row stride k, batch offset ks elements) and writes Y_s at s m n.
struct Problem {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Problem() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
  absl::Status Init(int m, int n, int k, GemmOut out, int splits) {
    RETURN_IF_ERROR(
        LtStatus(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc"));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    const cudaDataType_t ct = out == GemmOut::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
    const int ks = k / splits;
    RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, ks, n, k), "layout A"));
    RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, ks, m, k), "layout B"));
    RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&c, ct, n, m, n), "layout C"));
    if (splits > 1) {
      const int32_t count = splits;
      const int64_t in_offset = ks, out_offset = static_cast<int64_t>(m) * n;
      for (auto [l, offset] :
           {std::pair{a, in_offset}, std::pair{b, in_offset}, std::pair{c, out_offset}}) {
        RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutSetAttribute(
                                     l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
                                 "batch count"));
        RETURN_IF_ERROR(
            LtStatus(cublasLtMatrixLayoutSetAttribute(
                         l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset, sizeof(offset)),
                     "batch offset"));
      }
    }
    return absl::OkStatus();
  }
};

// Whether cuBLASLt runs `algo` on problem p within the workspace.
bool Accepts(cublasLtHandle_t handle, const Problem& p, const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t r;
  return cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.c, p.c, &algo, &r) ==
             CUBLAS_STATUS_SUCCESS &&
         r.workspaceSize <= kWorkspaceBytes;
}

// Decode-sized m share a kernel choice per bucket (1, 2, 4, then multiples of 8: the decode graph
// buckets), made at load time (PrepareDecode) or else at the bucket's first call.
int DecodeBucket(int m) { return m <= 2 ? m : m <= 4 ? 4 : (m + 7) / 8 * 8; }
constexpr int kVerifyRows = 64;  // rows PrepareDecode compares each candidate on

// Where SmallGemm beats the pinned algorithm (cuda_gemm_bench, H200: it streams big weight
// matrices faster at m = 1-2, and vocabulary-sized ones (the LM head) up to m = 16; for narrow
// outputs such as o_proj and down_proj at 0.6B, n = 1024, the pinned kernel is faster unsplit).
// Split shapes give it S times the warps; at m = 8 that still lost to the batched cuBLASLt call
// (H100: llama-3.2-1b batch 8 9% slower with it, NOTES.md run 8), so m <= 2 there too (second
// call: llama batch 8 1.06x faster than unsplit). Both paths give the same bits: a speed choice.
bool SmallWins(int m, int n, int splits) {
  if (splits > 1) return m <= 2;
  return m <= Gemm::kSmallM && (n >= 65536 || (m <= 2 && n >= 3072));
}

// Split-K off: one k loop per output element, no reduction (what batch invariance pins).
void NoSplitK(cublasLtMatmulAlgo_t* algo) {
  const int32_t one = 1;
  const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
  cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one));
  cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none,
                                       sizeof(none));
}

}  // namespace

struct Gemm::Algo {
  cublasLtMatmulAlgo_t algo;
};

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(bool batch_invariant, int reference_m,
                                                   bool small_m, int split_k, int split_columns) {
  std::unique_ptr<Gemm> g(new Gemm());
  g->batch_invariant_ = batch_invariant;
  g->small_m_ = batch_invariant && small_m;
  g->reference_m_ = reference_m;
  g->split_k_ = split_k;
  g->split_columns_ = split_columns;
  cublasLtHandle_t h;
  if (auto s = LtStatus(cublasLtCreate(&h), "create"); !s.ok()) return s;
  g->handle_ = h;
  absl::StatusOr<DeviceBuffer> ws = DeviceBuffer::Allocate(kWorkspaceBytes);
  if (!ws.ok()) return ws.status();
  g->workspace_ = std::move(*ws);
  if (batch_invariant && split_k != 1) {
    absl::StatusOr<DeviceBuffer> sw = DeviceBuffer::Allocate(kSplitWorkspaceBytes);
    if (!sw.ok()) return sw.status();
    g->split_ws_ = std::move(*sw);
  }
  return g;
}

Gemm::~Gemm() {
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

int Gemm::SplitsAndOut(int n, int k, GemmOut* out) {
  const int splits = Splits(n, k);
  if (splits > 1) *out = GemmOut::kF32;
  return splits;
}

int Gemm::Splits(int n, int k) {
  if (!batch_invariant_ || split_k_ == 1) return 1;
  auto [it, fresh] = splits_.try_emplace(std::pair{n, k}, 1);
  if (!fresh) return it->second;
  int s = 1;
  if (split_k_ > 1) {  // forced (not for vocabulary-sized outputs: wide enough unsplit)
    while (n < 65536 && 2 * s <= split_k_ && k % (128 * s) == 0) s *= 2;
  } else {
    s = SplitRuleSlices(n, k, split_columns_, split_residual_n_, split_residual_min_);
  }
  // The strided-batched problem needs an algorithm; decided once per shape, so never per m.
  if (s > 1 && !FindAlgo(reference_m_, n, k, GemmOut::kF32, s).ok()) s = 1;
  it->second = s;
  return s;
}

absl::StatusOr<const Gemm::Algo*> Gemm::FindAlgo(int m, int n, int k, GemmOut out, int splits) {
  const auto key = std::make_tuple(m, n, k, static_cast<int>(out), splits);
  if (auto it = algos_.find(key); it != algos_.end()) return it->second.get();
  Problem p;
  if (auto s = p.Init(m, n, k, out, splits); !s.ok()) return s;
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
  if (batch_invariant_) NoSplitK(&algo->algo);
  const Algo* raw = algo.get();
  algos_.emplace(key, std::move(algo));
  return raw;
}

namespace {

// Shapes the kernels take (m >= 0; n, k multiples of 8) and, unless m = 0, 16-byte aligned
// operands.
absl::Status CheckArgs(const void* x, const void* w, int m, int n, int k, const void* y) {
  if (m < 0 || n <= 0 || k <= 0 || n % 8 || k % 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gemm: bad shape m=", m, " n=", n, " k=", k, " (n, k multiples of 8)"));
  }
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (m > 0 && (!aligned(x) || !aligned(w) || !aligned(y))) {
    return absl::InvalidArgumentError("Gemm: pointers must be 16-byte aligned");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Gemm::Run(const Bf16* x, const Bf16* w, int m, int n, int k, void* y, GemmOut out,
                       Stream stream) {
  RETURN_IF_ERROR(CheckArgs(x, w, m, n, k, y));
  if (m == 0) return absl::OkStatus();
  const int s = Splits(n, k);
  if (s == 1) return RunSlices(x, w, m, n, k, 1, y, out, stream);
  // Partials of a chunk of rows in the workspace, then their slice-order sum into y.
  const size_t ob = out == GemmOut::kF32 ? 4 : 2;
  int64_t rows = split_ws_.size() / (static_cast<size_t>(s) * n * 4);
  if (rows >= 256) rows -= rows % 128;
  if (rows < 1) return absl::InternalError("Gemm: split workspace too small");
  for (int64_t r0 = 0; r0 < m; r0 += rows) {
    const int mc = static_cast<int>(std::min<int64_t>(rows, m - r0));
    RETURN_IF_ERROR(RunSlices(x + r0 * k, w, mc, n, k, s, split_ws_.data(), GemmOut::kF32, stream));
    RETURN_IF_ERROR(SplitReduce(split_ws_.as<float>(), s, mc, n,
                                static_cast<char*>(y) + r0 * n * ob, out == GemmOut::kF32, stream));
  }
  return absl::OkStatus();
}

absl::Status Gemm::RunPartials(const Bf16* x, const Bf16* w, int m, int n, int k, float* partials,
                               Stream stream) {
  RETURN_IF_ERROR(CheckArgs(x, w, m, n, k, partials));
  if (m == 0) return absl::OkStatus();
  return RunSlices(x, w, m, n, k, Splits(n, k), partials, GemmOut::kF32, stream);
}

bool Gemm::DecodeGemmFor(int m, int n, int k, GemmOut out, int* cols, int* stages) {
  if (!(batch_invariant_ && m >= 1 && m <= decode_max_m_ && k % 128 == 0 && DecodeServes(m, n) &&
        Splits(n, k) == 1)) {
    return false;
  }
  const auto it =
      decode_choice_.find(std::make_tuple(n, k, static_cast<int>(out), DecodeBucket(m)));
  if (it == decode_choice_.end() || it->second.kind != 2) return false;
  *cols = it->second.cols;
  *stages = it->second.stages;
  return true;
}

absl::Status Gemm::RunSlices(const Bf16* x, const Bf16* w, int m, int n, int k, int splits, void* y,
                             GemmOut out, Stream stream) {
  const bool f32 = out == GemmOut::kF32;
  if (batch_invariant_ && m <= decode_max_m_ && k % (128 * splits) == 0 && DecodeServes(m, n) &&
      (splits == 1 || f32)) {
    // Decode-sized: the kernel chosen for (n, k, out, bucket of m) at load time (PrepareDecode),
    // or else now, at the bucket's first call outside graph capture (the pinned one in capture).
    // Split shapes (splits = Splits(n, k), fixed per shape) choose among their partials' kernels.
    auto it = decode_choice_.find(std::make_tuple(n, k, static_cast<int>(out), DecodeBucket(m)));
    if (it == decode_choice_.end()) {
      if (!IsCapturing(stream)) return ChooseDecode(x, m, w, m, n, k, y, out, stream);
    } else if (it->second.kind == 2) {
      return DecodeGemm(x, w, m, n, k, y, f32, stream, it->second.cols, it->second.stages, splits);
    } else if (it->second.kind == 1) {
      return SmallGemm(x, w, m, n, k, y, f32, stream, splits);
    }
    return RunCublas(x, w, m, n, k, splits, y, out, stream);
  }
  if (!(small_m_ && SmallWins(m, n, splits) && k % (64 * splits) == 0)) {
    return RunCublas(x, w, m, n, k, splits, y, out, stream);
  }
  const auto key = std::make_tuple(n, k, static_cast<int>(out), splits);
  auto it = small_ok_.find(key);
  if (it != small_ok_.end() && it->second) return SmallGemm(x, w, m, n, k, y, f32, stream, splits);
  if (it == small_ok_.end() && !IsCapturing(stream)) {
    // First call of this shape: both paths on the same data, compared bit for bit.
    const size_t bytes = static_cast<size_t>(splits) * m * n * (f32 ? 4 : 2);
    absl::StatusOr<DeviceBuffer> ref = DeviceBuffer::Allocate(bytes);
    if (!ref.ok()) return ref.status();
    RETURN_IF_ERROR(RunCublas(x, w, m, n, k, splits, ref->data(), out, stream));
    RETURN_IF_ERROR(SmallGemm(x, w, m, n, k, y, f32, stream, splits));
    std::vector<uint8_t> a(bytes), b(bytes);
    RETURN_IF_ERROR(Synchronize(stream));
    RETURN_IF_ERROR(CopyToHost(a.data(), ref->data(), bytes));
    RETURN_IF_ERROR(CopyToHost(b.data(), y, bytes));
    const bool equal = std::memcmp(a.data(), b.data(), bytes) == 0;
    small_ok_[key] = equal;
    ++(equal ? small_verified_ : small_rejected_);
    if (equal) return absl::OkStatus();
    // cuBLASLt's result stands; `ref` is freed on return, so the copy must be done by then.
    RETURN_IF_ERROR(CopyAsync(y, ref->data(), bytes, stream));
    return Synchronize(stream);
  }
  return RunCublas(x, w, m, n, k, splits, y, out, stream);
}

absl::StatusOr<const Gemm::Algo*> Gemm::PinnedFor(int m, int n, int k, GemmOut out, int splits) {
  absl::StatusOr<const Algo*> pinned = FindAlgo(reference_m_, n, k, out, splits);
  if (!pinned.ok()) return pinned.status();
  const auto ck = std::make_tuple(m, n, k, static_cast<int>(out), splits);
  if (checked_.count(ck) > 0) return *pinned;
  Problem p;
  RETURN_IF_ERROR(p.Init(m, n, k, out, splits));
  if (!Accepts(static_cast<cublasLtHandle_t>(handle_), p, (*pinned)->algo)) return nullptr;
  checked_.insert(ck);
  return *pinned;
}

bool Gemm::Replaced(int m) const {
  for (const auto& [key, algo] : tuned_) {
    if (std::get<0>(key) == m && algo != nullptr) return true;
  }
  return false;
}

void Gemm::SetTuneSizes(const std::vector<int>& sizes) {
  tune_sizes_.clear();
  if (batch_invariant_) tune_sizes_.insert(sizes.begin(), sizes.end());
}

namespace {

// "id 66 tile 18 stages 35 inner 2 cluster 2 swizzle 0 custom 0": what tells cuBLASLt
// algorithms apart (inner shape and cluster shape are 16-bit attributes, the rest 32-bit).
std::string Describe(const cublasLtMatmulAlgo_t& algo) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, auto zero) {
    decltype(zero) v = zero;
    size_t written = 0;
    return cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) ==
                   CUBLAS_STATUS_SUCCESS
               ? static_cast<int64_t>(v)
               : int64_t{-1};
  };
  return absl::StrCat("id ", get(CUBLASLT_ALGO_CONFIG_ID, int32_t{0}), " tile ",
                      get(CUBLASLT_ALGO_CONFIG_TILE_ID, uint32_t{0}), " stages ",
                      get(CUBLASLT_ALGO_CONFIG_STAGES_ID, uint32_t{0}), " inner ",
                      get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, uint16_t{0}), " cluster ",
                      get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, uint16_t{0}), " swizzle ",
                      get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, uint32_t{0}), " custom ",
                      get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, uint32_t{0}));
}

// Outputs at most this large are tuned (their bitwise check copies them to the host); the
// vocabulary-sized LM head is left to the pinned algorithm and SmallGemm.
constexpr size_t kTuneMaxOutBytes = 8 << 20;
constexpr int kTuneCandidates = 16;
constexpr int kTuneRuns = 7;
// A candidate replaces the pinned algorithm only if this much faster (timing noise).
constexpr double kTuneMargin = 0.95;
// Launches timed together in a warm decode choice (KernelTimer::MinUs).
constexpr int kWarmChain = 4;
// The decode choice times its candidates in rounds, each candidate once a round in an order
// rotated every round (the fastest of kChoiceRuns runs), and compares the medians of their rounds:
// timed one after the other with the fastest of kTuneRuns, a process sometimes picked a kernel
// ~3x slower in its replays than the usual pick (bench/engine/NOTES.md run 25), as a drift in
// the GPU's state over the choice's ~ms favours whichever candidate it meets.
constexpr int kChoiceRounds = 7;
constexpr int kChoiceRuns = 3;

// Times launches the way Tune and the DecodeGemm choice compare kernels: microseconds of the
// fastest of kTuneRuns runs, each after the weights were pushed out of L2 (as in a step, where
// each layer's weights come from HBM); < 0 on a failed launch. The minimum, not the mean: a first
// run's one-time costs must not make a kernel look slow (the same algorithm timed twice differed
// by 50% with means).
// `flush` (allocated here at its first use, then kept by the caller: allocating and freeing
// 64 MB per timing made the first steps of a run measurably slower) is overwritten before each run.
class KernelTimer {
 public:
  KernelTimer(cudaStream_t s, DeviceBuffer* flush) : s_(s), flush_(*flush) {
    if (flush->size() == 0) {
      absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(64 << 20);  // > an H100's L2
      if (!b.ok()) return;
      *flush = std::move(*b);
    }
    ok_ = timer_.ok();
  }
  bool ok() const { return ok_; }
  // bool launch(): enqueues one run on the stream.
  // warm: as a decode replay runs a GEMM whose weights the backend prefetched into L2
  // (Gemm::set_decode_warm_max_m): no flush, and each run kWarmChain launches back to back, timed
  // together, so each launch after the first overlaps the one before it as far as programmatic
  // launch lets it (a kernel that copies its weights before waiting starts under its
  // predecessor; one without that waits for it to end); microseconds a launch. One untimed launch
  // goes first, so the timed ones start on a busy GPU: timed alone after the host's wait for the
  // previous run, a launch on an idle GPU measured ~2x its cold time (session 36, call 7).
  template <typename Launch>
  double MinUs(Launch launch, bool warm = false, int runs = kTuneRuns) {
    float best_ms = 1e30f;
    const int chain = warm ? kWarmChain : 1;
    for (int r = 0; r < runs; ++r) {
      if ((!warm && cudaMemsetAsync(flush_.data(), r, flush_.size(), s_) != cudaSuccess) ||
          (warm && !launch()) || !timer_.Start(s_).ok()) {
        return -1.0;
      }
      for (int c = 0; c < chain; ++c) {
        if (!launch()) return -1.0;
      }
      if (!timer_.Stop(s_).ok()) return -1.0;
      const absl::StatusOr<float> ms = timer_.ElapsedMs();
      if (!ms.ok()) return -1.0;
      best_ms = std::min(best_ms, *ms / chain);
    }
    return 1000.0 * best_ms;
  }

 private:
  cudaStream_t s_;
  DeviceBuffer& flush_;
  StreamTimer timer_;
  bool ok_ = false;
};

// cuBLASLt's candidates for problem p with split-K off (up to kTuneCandidates); *found = 0
// where the heuristic has none.
absl::Status SplitFreeCandidates(cublasLtHandle_t handle, const Problem& p,
                                 cublasLtMatmulHeuristicResult_t* result, int* found) {
  *found = 0;
  cublasLtMatmulPreference_t pref;
  RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceCreate(&pref), "preference"));
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                       sizeof(mask));
  if (cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, kTuneCandidates,
                                     result, found) != CUBLAS_STATUS_SUCCESS) {
    *found = 0;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  return absl::OkStatus();
}

// A bitwise-equal candidate timed at `us`: recorded if the fastest so far; true if it should then
// replace the pinned algorithm (faster by the margin).
bool FastestSoFar(Gemm::TuneRecord* rec, const cublasLtMatmulAlgo_t& algo, double us) {
  if (!(us > 0 && us < rec->best_us)) return false;
  rec->best_us = us;
  rec->best_algo = Describe(algo);
  return us < kTuneMargin * rec->pinned_us;
}

}  // namespace

absl::StatusOr<std::string> Gemm::PinnedNumerics(int n, int k, GemmOut out) {
  if (!batch_invariant_) return std::string();
  const int splits = SplitsAndOut(n, k, &out);
  absl::StatusOr<const Algo*> pinned = FindAlgo(reference_m_, n, k, out, splits);
  if (!pinned.ok()) return pinned.status();
  return absl::StrCat("cublasLt ", cublasLtGetVersion(), " ", n, "x", k,
                      out == GemmOut::kF32 ? " f32" : " bf16", " S=", splits, " ",
                      Describe((*pinned)->algo));
}

absl::Status Gemm::ChooseDecode(const Bf16* x, int x_rows, const Bf16* w, int m, int n, int k,
                                void* y, GemmOut out, Stream stream) {
  const bool f32 = out == GemmOut::kF32;
  const size_t es = f32 ? 4 : 2;
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  // Split shapes: every kernel writes the f32 partials [splits, rows, n] (RunPartials).
  const int splits = Splits(n, k);
  DecodeChoice& choice =
      decode_choice_[std::make_tuple(n, k, static_cast<int>(out), DecodeBucket(m))];
  // The pinned algorithm itself is the reference and the baseline: nothing is tuned here (a tuned
  // algorithm is checked on the data of its own first call, SetTuneSizes).
  const bool use_tuned = use_tuned_;
  use_tuned_ = false;
  struct Restore {
    bool& flag;
    bool value;
    ~Restore() { flag = value; }
  } restore{use_tuned_, use_tuned};
  // Bits are compared on all x_rows rows (>= m; the pinned algorithm's rows do not depend on how
  // many there are), times taken at m. y holds x_rows rows of the pinned result on return.
  const int vm = std::max(m, x_rows);
  RETURN_IF_ERROR(RunCublas(x, w, vm, n, k, splits, y, out, stream));  // the reference bits
  const size_t bytes = static_cast<size_t>(splits) * vm * n * es;
  // The choice is an optimization: where its buffers do not fit, the pinned algorithm stays.
  if (choice_out_.size() < bytes) {
    RETURN_IF_ERROR(Synchronize(stream));
    choice_out_ = DeviceBuffer();
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes);
    if (!b.ok()) return Synchronize(stream);
    choice_out_ = std::move(*b);
  }
  DeviceBuffer* tmp = &choice_out_;
  KernelTimer timer(s, &timing_flush_);
  if (!timer.ok()) return Synchronize(stream);
  std::vector<uint8_t> ref(bytes), got(bytes);
  RETURN_IF_ERROR(Synchronize(stream));
  RETURN_IF_ERROR(CopyToHost(ref.data(), y, bytes));
  auto pinned = [&] { return RunCublas(x, w, m, n, k, splits, tmp->data(), out, stream).ok(); };
  const bool warm = m <= decode_warm_max_m_;
  bool decode_equal = false, decode_differs = false;
  std::vector<DecodeChoice> candidates;
  if (small_m_ && decode_choose_small_ && m <= kSmallM && k % (64 * splits) == 0) {
    candidates.push_back({1, 0, 0});
  }
  for (auto [cols, stages] :
       {std::pair{8, 8}, std::pair{16, 8}, std::pair{32, 8}, std::pair{32, 4}}) {
    if (n % cols == 0) candidates.push_back({2, cols, stages});
  }
  auto run = [&](const DecodeChoice& c, int rows) {
    return (c.kind == 1
                ? SmallGemm(x, w, rows, n, k, tmp->data(), f32, stream, splits)
                : DecodeGemm(x, w, rows, n, k, tmp->data(), f32, stream, c.cols, c.stages, splits))
        .ok();
  };
  // The pinned algorithm (kind 0) and every candidate whose rows are bitwise its rows.
  std::vector<DecodeChoice> timed = {DecodeChoice{}};
  for (const DecodeChoice& c : candidates) {
    const int cm = c.kind == 1 ? std::min(vm, kSmallM) : std::min(vm, 64);
    if (!run(c, cm)) continue;  // that CTA shape does not fit, or no wgmma on this GPU
    const size_t slice = static_cast<size_t>(cm) * n * es;  // one slice's first cm rows
    RETURN_IF_ERROR(Synchronize(stream));
    RETURN_IF_ERROR(CopyToHost(got.data(), tmp->data(), splits * slice));
    bool equal = true;
    for (int sl = 0; sl < splits; ++sl) {  // slice sl sits sl * rows * n elements in
      equal = equal &&
              std::memcmp(ref.data() + sl * (bytes / splits), got.data() + sl * slice, slice) == 0;
    }
    if (c.kind == 2) (equal ? decode_equal : decode_differs) = true;
    if (equal) timed.push_back(c);  // other bits: never used
  }
  auto launch = [&](const DecodeChoice& c) { return c.kind == 0 ? pinned() : run(c, m); };
  const int nt = static_cast<int>(timed.size());
  std::vector<std::vector<double>> rounds(nt);
  for (int i = 0; i < nt; ++i) timer.MinUs([&] { return launch(timed[i]); });  // warm-up
  for (int r = 0; r < kChoiceRounds; ++r) {
    for (int j = 0; j < nt; ++j) {
      const int i = (r + j) % nt;
      const double us = timer.MinUs([&] { return launch(timed[i]); }, warm, kChoiceRuns);
      if (us > 0) rounds[i].push_back(us);
    }
  }
  auto median = [](std::vector<double>& v) {
    if (v.empty()) return -1.0;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  const double pinned_us = median(rounds[0]);
  double best_us = pinned_us;
  DecodeChoice best;
  for (int i = 1; i < nt; ++i) {
    const double us = median(rounds[i]);
    if (us > 0 && us < best_us && (best.kind != 0 || us < kTuneMargin * pinned_us)) {
      best_us = us;
      best = timed[i];
    }
  }
  if (decode_equal || decode_differs) ++(decode_differs ? small_rejected_ : small_verified_);
  choice = best;
  decode_log_.push_back(absl::StrCat(
      "m=", m, " (bucket ", DecodeBucket(m), ") n=", n, " k=", k, f32 ? " f32" : " bf16",
      splits > 1 ? absl::StrCat(" partials of ", splits, " k slices") : std::string(), ": pinned ",
      static_cast<int>(pinned_us * 10) / 10.0, " us, chosen ",
      best.kind == 0 ? std::string("pinned")
      : best.kind == 1
          ? std::string("SmallGemm")
          : absl::StrCat("DecodeGemm ", best.cols, " features x ", best.stages, " stages"),
      " ", static_cast<int>(best_us * 10) / 10.0, " us",
      decode_differs ? " (DecodeGemm's bits differed)" : ""));
  return Synchronize(stream);
}

namespace {

// The load-time runs' buffers: x, `rows` pseudo-random rows of standard normal bf16 values over k
// (terms of similar size, so a different summation order shows in many outputs), seeded by
// `seed`; y, room for `rows` rows of n outputs. An optimization's buffers: where they do not fit,
// the caller skips its work (the backend still loads). Synchronous upload.
struct PrepareBuffers {
  DeviceBuffer x, y;
};
absl::StatusOr<std::optional<PrepareBuffers>> MakePrepareBuffers(int rows, int n, int k,
                                                                 GemmOut out, uint32_t seed,
                                                                 int splits = 1) {
  std::vector<uint16_t> hx(static_cast<size_t>(rows) * k);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (uint16_t& v : hx) v = model::FloatToBf16(normal(rng));
  absl::StatusOr<DeviceBuffer> x = DeviceBuffer::Allocate(hx.size() * 2);
  absl::StatusOr<DeviceBuffer> y = DeviceBuffer::Allocate(static_cast<size_t>(splits) * rows * n *
                                                          (out == GemmOut::kF32 ? 4 : 2));
  if (!x.ok() || !y.ok()) return std::nullopt;
  RETURN_IF_ERROR(CopyToDevice(x->data(), hx.data(), hx.size() * 2));
  return PrepareBuffers{std::move(*x), std::move(*y)};
}

}  // namespace

absl::Status Gemm::PrepareDecode(const Bf16* w, int n, int k, GemmOut out, Stream stream) {
  const int splits = SplitsAndOut(n, k, &out);
  if (decode_max_m_ == 0 || k % (128 * splits) != 0 || !DecodeServes(decode_max_m_, n)) {
    return absl::OkStatus();
  }
  // x: kVerifyRows rows, every candidate compared on all of them; y: the pinned result of all of
  // them (ChooseDecode compares on every row of x). Where these do not fit, the shape keeps its
  // first-call choice (or the pinned algorithm).
  absl::StatusOr<std::optional<PrepareBuffers>> bufs =
      MakePrepareBuffers(kVerifyRows, n, k, out, static_cast<uint32_t>(n * 131 + k), splits);
  if (!bufs.ok()) return bufs.status();
  if (!bufs->has_value()) return absl::OkStatus();
  DeviceBuffer* x = &(*bufs)->x;
  DeviceBuffer* y = &(*bufs)->y;
  for (int m = 1; m <= decode_max_m_; ++m) {
    if (m != DecodeBucket(m) || !DecodeServes(m, n) ||
        decode_choice_.count(std::make_tuple(n, k, static_cast<int>(out), m)) > 0) {
      continue;
    }
    RETURN_IF_ERROR(ChooseDecode(x->as<Bf16>(), kVerifyRows, w, m, n, k, y->data(), out, stream));
  }
  return Synchronize(stream);  // x and y are freed on return
}

absl::Status Gemm::PrepareTune(const Bf16* w, int n, int k, GemmOut out, Stream stream) {
  if (!batch_invariant_ || !use_tuned_ || tune_sizes_.empty()) return absl::OkStatus();
  // x: rows as PrepareDecode's (the tuning compares candidates' bits on them), as many as the
  // largest size; y: that size's output.
  absl::StatusOr<std::optional<PrepareBuffers>> bufs =
      MakePrepareBuffers(*tune_sizes_.rbegin(), n, k, out, static_cast<uint32_t>(n * 131 + k + 1));
  if (!bufs.ok()) return bufs.status();
  if (!bufs->has_value()) return absl::OkStatus();
  DeviceBuffer* x = &(*bufs)->x;
  DeviceBuffer* y = &(*bufs)->y;
  for (int m : tune_sizes_) {
    RETURN_IF_ERROR(Run(x->as<Bf16>(), w, m, n, k, y->data(), out, stream));
  }
  return Synchronize(stream);  // x and y are freed on return
}

void Gemm::ReleaseTimingBuffers() {
  timing_flush_ = DeviceBuffer();
  choice_out_ = DeviceBuffer();
}

absl::Status Gemm::Tune(const Bf16* x, const Bf16* w, int m, int n, int k, void* y, GemmOut out,
                        Stream stream) {
  const auto key = std::make_tuple(m, n, k, static_cast<int>(out));
  const auto handle = static_cast<cublasLtHandle_t>(handle_);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  absl::StatusOr<const Algo*> pinned_or = PinnedFor(m, n, k, out, 1);
  if (!pinned_or.ok()) return pinned_or.status();
  const Algo* pinned = *pinned_or;
  Problem p;
  RETURN_IF_ERROR(p.Init(m, n, k, out, 1));
  const float alpha = 1.f, beta = 0.f;
  auto launch = [&](const cublasLtMatmulAlgo_t& algo, void* dst) {
    return cublasLtMatmul(handle, p.desc, &alpha, w, p.a, x, p.b, &beta, dst, p.c, dst, p.c, &algo,
                          workspace_.data(), kWorkspaceBytes, s);
  };
  if (pinned == nullptr) {  // nothing to compare with: the heuristic's pick, as RunCublas does
    tuned_.emplace(key, nullptr);
    return RunCublas(x, w, m, n, k, 1, y, out, stream);
  }
  RETURN_IF_ERROR(LtStatus(launch(pinned->algo, y), "matmul"));
  const size_t bytes = static_cast<size_t>(m) * n * (out == GemmOut::kF32 ? 4 : 2);
  // Tuning is an optimization: where its buffers do not fit, the pinned algorithm stays.
  absl::StatusOr<DeviceBuffer> tmp = DeviceBuffer::Allocate(bytes);
  KernelTimer timer(s, &timing_flush_);
  TuneRecord rec{m, n, k, out == GemmOut::kF32};
  rec.pinned_algo = Describe(pinned->algo);
  std::unique_ptr<Algo> best;
  if (tmp.ok() && timer.ok()) {
    std::vector<uint8_t> ref(bytes), got(bytes);
    RETURN_IF_ERROR(Synchronize(stream));
    RETURN_IF_ERROR(CopyToHost(ref.data(), y, bytes));
    auto time = [&](const cublasLtMatmulAlgo_t& algo) {
      return timer.MinUs([&] { return launch(algo, tmp->data()) == CUBLAS_STATUS_SUCCESS; });
    };
    time(pinned->algo);  // warm-up: first launches of the shape
    rec.pinned_us = rec.best_us = time(pinned->algo);
    cublasLtMatmulHeuristicResult_t result[kTuneCandidates];
    int found = 0;
    RETURN_IF_ERROR(SplitFreeCandidates(handle, p, result, &found));
    for (int i = 0; i < found && rec.pinned_us > 0; ++i) {
      cublasLtMatmulAlgo_t algo = result[i].algo;
      NoSplitK(&algo);
      if (!Accepts(handle, p, algo)) continue;
      ++rec.candidates;
      if (launch(algo, tmp->data()) != CUBLAS_STATUS_SUCCESS) continue;
      RETURN_IF_ERROR(Synchronize(stream));
      RETURN_IF_ERROR(CopyToHost(got.data(), tmp->data(), bytes));
      if (std::memcmp(ref.data(), got.data(), bytes) != 0) continue;  // other bits: never used
      ++rec.equal;
      if (FastestSoFar(&rec, algo, time(algo))) {
        best = std::make_unique<Algo>();
        best->algo = algo;
      }
    }
  }
  rec.replaced = best != nullptr;
  tune_log_.push_back(rec);
  tuned_.emplace(key, std::move(best));
  // The temporaries are freed on return: nothing may still use them.
  return Synchronize(stream);
}

absl::Status Gemm::PreparePrefill(const Bf16* w, int n, int k, GemmOut out, Stream stream) {
  const int splits = SplitsAndOut(n, k, &out);  // split: one strided-batched problem
  const auto key = std::make_tuple(n, k, static_cast<int>(out));
  if (prefill_min_m_ == 0 || n >= 65536 || prefill_.count(key) > 0) return absl::OkStatus();
  const int big = std::max(kPrefillTimeM, prefill_min_m_ + 57), odd = prefill_min_m_ + 57;
  const size_t es = out == GemmOut::kF32 ? 4 : 2;
  const size_t bytes = static_cast<size_t>(splits) * big * n * es;
  // An optimization: where its buffers do not fit, the pinned algorithm stays.
  absl::StatusOr<std::optional<PrepareBuffers>> bufs =
      MakePrepareBuffers(big, n, k, out, static_cast<uint32_t>(n * 131 + k + 2), splits);
  if (!bufs.ok()) return bufs.status();
  absl::StatusOr<DeviceBuffer> tmp = DeviceBuffer::Allocate(bytes);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  KernelTimer timer(s, &timing_flush_);
  if (!bufs->has_value() || !tmp.ok() || !timer.ok()) return absl::OkStatus();
  const Bf16* x = (*bufs)->x.as<Bf16>();
  void* ref = (*bufs)->y.data();
  const int sizes[3] = {big, odd, prefill_min_m_};
  Problem p[3];
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(p[i].Init(sizes[i], n, k, out, splits));
  const auto handle = static_cast<cublasLtHandle_t>(handle_);
  const float alpha = 1.f, beta = 0.f;
  auto launch = [&](const cublasLtMatmulAlgo_t& algo, int i, void* dst) {
    return cublasLtMatmul(handle, p[i].desc, &alpha, w, p[i].a, x, p[i].b, &beta, dst, p[i].c, dst,
                          p[i].c, &algo, workspace_.data(), kWorkspaceBytes,
                          s) == CUBLAS_STATUS_SUCCESS;
  };
  auto accepts = [&](const cublasLtMatmulAlgo_t& algo, int i) {
    return Accepts(handle, p[i], algo);
  };
  // The outputs at `big` and at `odd` rows, to the host.
  auto outputs = [&](const cublasLtMatmulAlgo_t& algo, void* dst,
                     std::vector<uint8_t>* got) -> absl::StatusOr<bool> {
    got->resize(bytes + static_cast<size_t>(splits) * odd * n * es);
    if (!launch(algo, 0, dst)) return false;
    RETURN_IF_ERROR(Synchronize(stream));
    RETURN_IF_ERROR(CopyToHost(got->data(), dst, bytes));
    if (!launch(algo, 1, dst)) return false;
    RETURN_IF_ERROR(Synchronize(stream));
    RETURN_IF_ERROR(CopyToHost(got->data() + bytes, dst, got->size() - bytes));
    return true;
  };
  auto time = [&](const cublasLtMatmulAlgo_t& algo, int i) {
    return timer.MinUs([&] { return launch(algo, i, tmp->data()); });
  };
  TuneRecord rec{big, n, k, out == GemmOut::kF32};
  absl::StatusOr<const Algo*> pinned_or = FindAlgo(reference_m_, n, k, out, splits);
  if (!pinned_or.ok()) return pinned_or.status();
  const cublasLtMatmulAlgo_t pinned = (*pinned_or)->algo;
  rec.pinned_algo = Describe(pinned);
  std::unique_ptr<Algo> best;
  std::vector<uint8_t> want, got;
  absl::StatusOr<bool> ran = false;
  if (accepts(pinned, 0) && accepts(pinned, 1) && accepts(pinned, 2))
    ran = outputs(pinned, ref, &want);
  if (!ran.ok()) return ran.status();
  double pinned_small = 0;
  if (*ran) {
    time(pinned, 0);  // warm-up: first launches of the shape
    pinned_small = time(pinned, 2);
    rec.pinned_us = rec.best_us = time(pinned, 0) + pinned_small;
    cublasLtMatmulHeuristicResult_t result[kTuneCandidates];
    int found = 0;
    RETURN_IF_ERROR(SplitFreeCandidates(handle, p[0], result, &found));
    for (int i = 0; i < found && rec.pinned_us > 0; ++i) {
      cublasLtMatmulAlgo_t algo = result[i].algo;
      NoSplitK(&algo);
      if (!accepts(algo, 0) || !accepts(algo, 1) || !accepts(algo, 2)) continue;
      ++rec.candidates;
      absl::StatusOr<bool> ok = outputs(algo, tmp->data(), &got);
      if (!ok.ok()) return ok.status();
      if (!*ok || got != want) continue;  // other bits (or no run): never used
      ++rec.equal;
      const double small = time(algo, 2);  // no slower at the threshold
      if (small > 0 && small <= pinned_small && FastestSoFar(&rec, algo, time(algo, 0) + small)) {
        best = std::make_unique<Algo>();
        best->algo = algo;
      }
    }
  }
  rec.replaced = best != nullptr;
  prefill_log_.push_back(rec);
  prefill_.emplace(key, std::move(best));
  return Synchronize(stream);  // the buffers are freed on return
}

absl::Status Gemm::RunCublas(const Bf16* x, const Bf16* w, int m, int n, int k, int splits, void* y,
                             GemmOut out, Stream stream) {
  Problem p;
  RETURN_IF_ERROR(p.Init(m, n, k, out, splits));
  const auto handle = static_cast<cublasLtHandle_t>(handle_);
  const Algo* algo = nullptr;
  if (batch_invariant_ && use_tuned_ && splits == 1 && tune_sizes_.count(m) > 0 &&
      static_cast<size_t>(m) * n * 4 <= kTuneMaxOutBytes) {
    auto it = tuned_.find(std::make_tuple(m, n, k, static_cast<int>(out)));
    if (it == tuned_.end()) {
      if (!IsCapturing(stream)) return Tune(x, w, m, n, k, y, out, stream);
    } else {
      algo = it->second.get();  // nullptr: the pinned one below
    }
  }
  if (batch_invariant_ && algo == nullptr && prefill_min_m_ > 0 && m >= prefill_min_m_ &&
      (splits == 1 || out == GemmOut::kF32)) {
    auto it = prefill_.find(std::make_tuple(n, k, static_cast<int>(out)));
    if (it != prefill_.end() && it->second != nullptr) {
      auto [usable, fresh] =
          prefill_usable_.try_emplace(std::make_tuple(m, n, k, static_cast<int>(out)), false);
      if (fresh) usable->second = Accepts(handle, p, it->second->algo);
      if (usable->second) algo = it->second.get();
    }
  }
  if (batch_invariant_ && algo == nullptr) {
    absl::StatusOr<const Algo*> pinned = PinnedFor(m, n, k, out, splits);
    if (!pinned.ok()) return pinned.status();
    if (*pinned != nullptr) {
      algo = *pinned;
    } else {
      ++fallbacks_;
    }
  }
  if (algo == nullptr) {
    absl::StatusOr<const Algo*> a = FindAlgo(m, n, k, out, splits);
    if (!a.ok()) return a.status();
    algo = *a;
  }
  const float alpha = 1.f, beta = 0.f;
  return LtStatus(cublasLtMatmul(handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c,
                                 &algo->algo, workspace_.data(), kWorkspaceBytes, stream),
                  "matmul");
}

}  // namespace cascade::cuda
