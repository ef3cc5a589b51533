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
//
// Decode GEMM: with set_decode_max_m, a call of up to that many rows (<= 64) runs the
// kernel chosen for its (n, k, output type, bucket of m: 1, 2, 4, then multiples of 8, the decode
// graph buckets; a split shape's calls are its f32 partials, all slices in one launch): the
// pinned algorithm, SmallGemm (where set_decode_choose_small, off in the backend by default), or
// DecodeGemm (ops.h, decode_gemm.cu: one
// warpgroup per 8-32 output features over the whole k loop, the same k16-step chain on wgmma) in
// one of a few CTA shapes. The choice is made by PrepareDecode when a backend loads its weights
// (on 64 rows of normal pseudo-random x), or else at the bucket's first call outside graph
// capture (on that call's x; during capture an unchosen bucket takes the pinned algorithm).
// Every candidate's rows are compared bitwise with the pinned algorithm's; only equal ones are
// timed, the pinned one among them, in 7 interleaved rounds (each the fastest of 3 runs; the
// order rotated a round), their medians compared, and an alternative is kept only if >= 5%
// faster than the pinned algorithm. A row's bits never depend on the choice. (An H100
// measured DecodeGemm 20-35% faster than the pinned kernels on qwen3-8b's projections at m <= 32
// and slower on qwen3-0.6b's n = 1024 ones, where its k16 chain bounds a CTA: engine NOTES run 11.)
//
// Batch-invariant split-K: a narrow GEMM (few output tiles, e.g. o_proj / down_proj with n =
// hidden) leaves most of the chip idle at small m. So k is cut into S equal slices, S = Splits(n,
// k) chosen from the shape alone (never from m), each slice's product accumulated from zero into
// an fp32 partial, and the partials summed in slice order: y = out(((p0 + p1) + p2) + ...).
// Every m runs the same slices and the same sum, so a row's bits still do not depend on m. The
// partials come from one strided-batched cuBLASLt call (batch = slice, algorithm pinned per (n,
// k, S) like the unsplit ones) or, at decode-sized m, from SmallGemm's split variant after the
// same first-use bitwise comparison. Run() reduces them itself (SplitReduce, through a fixed
// workspace, in row chunks: rows never mix, so chunking changes no bits); RunPartials() hands
// them to the caller, who fuses the sum into its next pass (AddRmsNormSplit). Gemm::Create's
// split_k picks it (1 here: off); the backend's default is the rule (CudaBackendOptions::split_k:
// decode at batch 1-32 ~0.88x the unsplit step on an H200, engine NOTES.md runs 23 and 28). The
// rule: S doubles while S n stays within split_columns (4096); a shape of the residual's width
// (set_split_residual_n: o_proj / down_proj, whose partials the next norm sums for free) is cut
// in at least two, so a wide model's longest chains are halved too (qwen3-8b: o_proj and
// down_proj in 2, decode 0.84-0.98x at batch 1-256 on an H200, prefill 0.98-0.99x; run 31).
//
// Tuned decode sizes: the pinned algorithm (picked at m = 256) is far from the weights'
// bandwidth at decode-sized m (an H100 profile of a batch-64 step: 8-11 us per GEMM against a
// 1.3-3.8 us bytes floor). For the m values given to SetTuneSizes (the decode graph buckets), the
// first call with such an m (outside graph capture) runs cuBLASLt's candidates for that m (split-K
// off) on the call's own data, keeps those whose output is bitwise the pinned algorithm's, times
// them and the pinned one (weights flushed from L2 before each run), and uses the fastest for that
// (m, n, k, output type) from then on. A row's bits therefore never depend on the choice: an
// algorithm is used only at the m where it gave the pinned algorithm's bits on real data. A GEMM
// timed alone is not a step: the backend also times its decode graph with and without the tuned
// algorithms and keeps the faster (cuda_backend.cc CaptureDecodeGraph).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/backend/cuda/cuda_defaults.h"
#include "gpu_worker/backend/cuda/device.h"
#include "gpu_worker/backend/cuda/ops.h"

namespace cascade::cuda {

enum class GemmOut { kBf16, kF32 };

class Gemm {
 public:
  // reference_m: the m at which pinned algorithms are chosen. split_k: 1 = never split
  // (default), 0 = the built-in rule (Splits), S > 1 = S slices wherever k allows (benchmarks,
  // tests). Batch-invariant mode only; heuristic mode leaves split-K to cuBLAS. split_columns:
  // the rule's bound on S n (Splits).
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(bool batch_invariant, int reference_m = 256,
                                                      bool small_m = true, int split_k = 1,
                                                      int split_columns = kDefaultSplitColumns);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // x: [m, k] bf16, w: [n, k] bf16, y: [m, n] bf16 or f32, all dense row-major.
  // REQUIRES: k and n multiples of 8, 16-byte aligned pointers (checked).
  // Not thread-safe (caches algorithms).
  absl::Status Run(const Bf16* x, const Bf16* w, int m, int n, int k, void* y, GemmOut out,
                   Stream stream);

  // Slices of k for the shape: a function of (n, k) and the options only (1: not split). Fixed
  // for the life of this object. A power of two with k % (64 S) == 0.
  int Splits(int n, int k);

  // The Splits(n, k) = S partial products of y = x w^T, unreduced: partials: [S, m, n] f32,
  // partials[s] = x[:, s k/S : (s+1) k/S] w[:, same]^T, each accumulated from zero. For S = 1
  // that is the f32 product itself. REQUIRES: as Run.
  absl::Status RunPartials(const Bf16* x, const Bf16* w, int m, int n, int k, float* partials,
                           Stream stream);

  // Decode-sized m at which Run may use a tuned algorithm (see above); none by default.
  void SetTuneSizes(const std::vector<int>& sizes);
  // One line per tuned (m, n, k, output): candidates run, bitwise equal, the pinned and the best
  // equal time (us), and whether the pick replaced the pinned algorithm.
  struct TuneRecord {
    int m = 0, n = 0, k = 0;
    bool f32 = false;
    int candidates = 0, equal = 0;
    double pinned_us = 0, best_us = 0;
    bool replaced = false;
    std::string pinned_algo, best_algo;  // cuBLASLt algorithm id, tile, stages, cluster shape
  };
  const std::vector<TuneRecord>& tune_log() const { return tune_log_; }
  // Whether some GEMM at this m runs a tuned algorithm instead of the pinned one.
  bool Replaced(int m) const;
  // false: every call takes the pinned algorithm (and tunes nothing), e.g. to capture a graph of
  // the pinned algorithms beside the tuned one. True by default.
  void set_use_tuned(bool on) { use_tuned_ = on; }

  // Decode-sized calls (m <= max_m <= 64, unsplit, k % 128 == 0, n < 65536) on the kernel chosen
  // per (n, k, output, bucket of m) as described above; 0 (the default): off.
  void set_decode_max_m(int max_m) {
    decode_max_m_ = batch_invariant_ ? std::clamp(max_m, 0, 64) : 0;
  }
  // Buckets up to max_m have their decode-sized candidates timed as a decode replay runs them
  // when the backend prefetches their weights into L2 ahead of the GEMM: weights resident in L2,
  // launches back to back under programmatic launch; above it (and with 0, the default) one
  // launch at a time after the weights were pushed out of L2. Timed alone on flushed L2, DecodeGemm
  // at 16 and 32 features a CTA were within ~10% for qwen3-0.6b's gate_up at m = 1, and engines
  // picked either; in a replay the 32-feature kernel added 2.9-3.5 us a launch and the 16-feature
  // one 4.4-4.5 (bench/engine/NOTES.md run 22). Only the choice changes; every candidate is
  // bitwise the pinned algorithm.
  void set_decode_warm_max_m(int max_m) { decode_warm_max_m_ = max_m; }
  // Whether SmallGemm is among the decode choice's candidates (it still serves the shapes the
  // choice does not, e.g. the LM head). SmallGemm waits for the previous kernel before its first
  // weight load, where DecodeGemm copies its first chunks before the wait, so in a replay under
  // programmatic launch it adds more of its time than the choice's timing shows. The same bits.
  void set_decode_choose_small(bool on) { decode_choose_small_ = on; }
  // Whether vocabulary-sized shapes (n >= 65536: the LM head) take the decode choice too, for
  // rows past SmallGemm's (kSmallM < m <= the decode max m; SmallGemm serves m <= kSmallM as
  // before). Off by default: there the pinned large-tile kernel runs (an H200 batch-64 step's LM
  // head: 137 us against a 74 us bytes floor; bench/engine/NOTES.md run 43). The same bits.
  void set_decode_vocab(bool on) { decode_vocab_ = on; }
  // Makes the decode-sized kernel choice of every bucket up to the decode max m for weights w
  // ([n, k]) now, on pseudo-random rows as x (a backend calls it at load time, so no request pays
  // the choice's timing runs). No-op for shapes the decode path does not serve.
  absl::Status PrepareDecode(const Bf16* w, int n, int k, GemmOut out, Stream stream);
  // Runs weights w ([n, k]) once at every tune size on pseudo-random rows, so that whatever the
  // first call of a size does (tune the cuBLASLt algorithm, verify SmallGemm's bits) is done now,
  // at load time, and not on a request's step. Call after PrepareDecode. No-op without tune
  // sizes; where its buffers do not fit, the first call of each size does it as before.
  absl::Status PrepareTune(const Bf16* w, int n, int k, GemmOut out, Stream stream);
  // Prefill-sized calls (unsplit, m >= min_m, no tune size) run the cuBLASLt algorithm
  // PreparePrefill chose for their weight shape, where it chose one; 0 (the default): off, the
  // pinned algorithm. Batch-invariant mode only.
  // Under the rule, shapes with n == residual_n (the model's hidden size) are cut in at least
  // `min_slices` (a power of two; 1: S by split_columns alone). Before the first Splits() call.
  void set_split_residual_n(int residual_n, int min_slices) {
    split_residual_n_ = residual_n;
    split_residual_min_ = min_slices;
  }
  void set_prefill_min_m(int min_m) { prefill_min_m_ = batch_invariant_ ? std::max(min_m, 0) : 0; }
  // Chooses the prefill algorithm of weights w ([n, k]) now (a backend calls it at load time): the
  // pinned algorithm was picked at the reference m (256) and runs large m far below the GEMM rate
  // (up to 2.6x behind cuBLASLt's own pick at m = 2048 on an H100, engine NOTES run 8).
  // cuBLASLt's candidates for m = kPrefillTimeM (split-K off) run on pseudo-random rows at that m
  // and at min_m + 57 rows (a partial tile); those whose outputs are bitwise the pinned
  // algorithm's at both are timed at kPrefillTimeM and at min_m (weights flushed from L2, fastest
  // of 7), and the fastest is kept if its summed time is >= 5% below the pinned one's and it is
  // no slower at min_m. A row's bits never depend on the choice (the same k16 chain per output:
  // cuBLASLt's non-split kernels all accumulate so). A split shape (Splits > 1) chooses the same
  // way among algorithms for its strided-batched f32 partials (each slice one such chain). No-op
  // when off and for vocabulary-sized outputs.
  absl::Status PreparePrefill(const Bf16* w, int n, int k, GemmOut out, Stream stream);
  static constexpr int kPrefillTimeM = 2048;
  // One record per shape PreparePrefill looked at (m = kPrefillTimeM; times: that m plus min_m).
  const std::vector<TuneRecord>& prefill_log() const { return prefill_log_; }

  // Frees the buffers kept between timings (a 64 MB L2 flush buffer and a scratch output), e.g.
  // once the load-time choices are made; a later timing allocates them again. REQUIRES: no work
  // using them is pending (every timing synchronizes before it returns).
  void ReleaseTimingBuffers();
  // Whether Run of m rows of weights [n, k] with output `out` uses DecodeGemm (the kernel chosen
  // for m's bucket by PrepareDecode), and then its CTA shape; false for the pinned algorithm,
  // SmallGemm or a bucket not chosen yet. A caller may then run DecodeGemm itself with a fused
  // epilogue (ops.h DecodeGemmSiluMul), whose rows carry the bits Run's would.
  bool DecodeGemmFor(int m, int n, int k, GemmOut out, int* cols, int* stages);
  // One line per decode-sized (bucket of m, n, k, output): the pinned time and the kernel kept.
  const std::vector<std::string>& decode_log() const { return decode_log_; }

  // What fixes the bits of weights [n, k]'s products with output `out` on this device: cuBLASLt's
  // version, the shape's split count and the attributes of its pinned algorithm (every kernel
  // Run may use instead gives that algorithm's bits). Empty in heuristic mode, whose algorithm
  // changes with m. Errors: as FindAlgo (cuBLASLt has no algorithm for the shape).
  absl::StatusOr<std::string> PinnedNumerics(int n, int k, GemmOut out);

  int64_t fallbacks() const { return fallbacks_; }
  // Shapes verified bitwise and served by SmallGemm or DecodeGemm; shapes that differed.
  int small_verified() const { return small_verified_; }
  int small_rejected() const { return small_rejected_; }
  static constexpr int kSmallM = 16;

 private:
  struct Algo;
  Gemm() = default;
  absl::StatusOr<const Algo*> FindAlgo(int m, int n, int k, GemmOut out, int splits);
  // Splits(n, k), and `out` as the shape's calls produce it: a split shape's calls are its f32
  // partials (RunPartials, or Run's before the reduction), whatever the final output type.
  int SplitsAndOut(int n, int k, GemmOut* out);
  // S == 1: y = x w^T in `out`; S > 1: f32 partials [S, m, n] into y. SmallGemm or cuBLASLt.
  absl::Status RunSlices(const Bf16* x, const Bf16* w, int m, int n, int k, int splits, void* y,
                         GemmOut out, Stream stream);
  absl::Status RunCublas(const Bf16* x, const Bf16* w, int m, int n, int k, int splits, void* y,
                         GemmOut out, Stream stream);
  // The pinned algorithm for this call's m (nullptr: cuBLASLt rejects it there).
  absl::StatusOr<const Algo*> PinnedFor(int m, int n, int k, GemmOut out, int splits);
  // First decode-sized call of (n, k, out, bucket of m): y = the pinned result; times the pinned
  // algorithm, SmallGemm and DecodeGemm CTA shapes whose outputs are bitwise the pinned one's
  // (interleaved rounds, medians), keeps the fastest (an alternative only if >= 5% faster than the
  // pinned algorithm). x has x_rows >= m rows: the bits are compared on all of them, the times
  // taken at m; y receives the pinned result of all x_rows rows.
  absl::Status ChooseDecode(const Bf16* x, int x_rows, const Bf16* w, int m, int n, int k, void* y,
                            GemmOut out, Stream stream);
  // First call at a tune size: y = the pinned result; picks the algorithm for (m, n, k, out).
  absl::Status Tune(const Bf16* x, const Bf16* w, int m, int n, int k, void* y, GemmOut out,
                    Stream stream);

  bool batch_invariant_ = true;
  int reference_m_ = 256;
  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer workspace_;
  int split_k_ = 0;
  int split_columns_ = kDefaultSplitColumns;
  int split_residual_n_ = 0;  // set_split_residual_n
  int split_residual_min_ = 1;
  DeviceBuffer split_ws_;  // Run's partials of split shapes, [S, rows, n] f32 per row chunk
  // (m, n, k, out, splits) -> algorithm; m = reference_m_ for the pinned ones.
  std::map<std::tuple<int, int, int, int, int>, std::unique_ptr<Algo>> algos_;
  // (m, n, k, out, splits) verified for a pinned algorithm.
  std::set<std::tuple<int, int, int, int, int>> checked_;
  std::map<std::pair<int, int>, int> splits_;  // (n, k) -> S
  int64_t fallbacks_ = 0;
  bool small_m_ = true;
  std::map<std::tuple<int, int, int, int>, bool> small_ok_;  // (n, k, out, S) -> verified equal
  int decode_max_m_ = 0;
  int decode_warm_max_m_ = 0;        // set_decode_warm_max_m
  bool decode_choose_small_ = true;  // set_decode_choose_small
  bool decode_vocab_ = false;        // set_decode_vocab
  // Whether the decode choice serves an (m, n) call: narrow shapes, or vocabulary-sized ones past
  // SmallGemm's rows with set_decode_vocab.
  bool DecodeServes(int m, int n) const { return n < 65536 || (decode_vocab_ && m > kSmallM); }
  struct DecodeChoice {
    int kind = 0;  // 0: the pinned algorithm, 1: SmallGemm, 2: DecodeGemm (cols, stages)
    int cols = 0, stages = 0;
  };
  // (n, k, out, bucket of m: 1, 2, 4, then multiples of 8) -> the kernel
  std::map<std::tuple<int, int, int, int>, DecodeChoice> decode_choice_;
  std::vector<std::string> decode_log_;
  DeviceBuffer timing_flush_, choice_out_;  // kept between timings (see KernelTimer)
  std::set<int> tune_sizes_;
  bool use_tuned_ = true;
  // (m, n, k, out) -> the tuned algorithm; nullptr: the pinned one stays.
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<Algo>> tuned_;
  std::vector<TuneRecord> tune_log_;
  int prefill_min_m_ = 0;
  // (n, k, out) -> the prefill algorithm; nullptr: the pinned one stays.
  std::map<std::tuple<int, int, int>, std::unique_ptr<Algo>> prefill_;
  // (m, n, k, out) -> whether cuBLASLt accepts the shape's prefill algorithm at that m.
  std::map<std::tuple<int, int, int, int>, bool> prefill_usable_;
  std::vector<TuneRecord> prefill_log_;
  int small_verified_ = 0, small_rejected_ = 0;
};

}  // namespace cascade::cuda
