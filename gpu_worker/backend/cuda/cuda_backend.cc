// engine::Backend on one GPU: schedule-free forward of a ForwardBatch through the Qwen3/Llama
// decoder with bf16 weights, a float32 residual stream, and the kernels of ops.h / attention.h.
#include "gpu_worker/backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gpu_worker/backend/cuda/attention.h"
#include "gpu_worker/backend/cuda/device.h"
#include "gpu_worker/backend/cuda/gemm.h"
#include "gpu_worker/backend/cuda/ops.h"
#include "gpu_worker/backend/cuda/status_macros.h"

namespace cascade::cuda {
namespace {

// Host steady clock in ns (CudaGraphStats::ReplayHost).
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Adds the host time from t0 to its destruction to *sum.
struct ElapsedNsTo {
  int64_t* sum;
  int64_t t0 = NowNs();
  ~ElapsedNsTo() { *sum += NowNs() - t0; }
};

// HF's inverse frequencies (double, rounded to float once), with Llama-3 scaling if configured.
std::vector<float> InvFreq(const model::ModelConfig& c) {
  const int64_t d = c.head_dim;
  std::vector<float> out(d / 2);
  const model::RopeScaling& s = c.rope_scaling;
  for (int64_t i = 0; i < d / 2; ++i) {
    double f = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    if (s.enabled) {
      const double old_len = static_cast<double>(s.original_max_position_embeddings);
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > old_len / s.low_freq_factor) {
        f /= s.factor;
      } else if (wavelen >= old_len / s.high_freq_factor) {
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
    out[i] = static_cast<float>(f);
  }
  return out;
}

// Appends tensor `name` as bf16 bits to `out`.
absl::Status AppendBf16(const model::Model& m, const std::string& name,
                        std::vector<uint16_t>* out) {
  const model::TensorView* t = m.Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("cuda backend: missing tensor ", name));
  const size_t n = static_cast<size_t>(t->numel()), at = out->size();
  out->resize(at + n);
  if (t->dtype == model::DType::kBF16) {
    std::memcpy(out->data() + at, t->data, n * 2);
  } else {
    std::vector<float> f(n);
    model::ToFloat32(*t, f.data());
    for (size_t i = 0; i < n; ++i) (*out)[at + i] = model::FloatToBf16(f[i]);
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceBuffer> ToDevice(const std::vector<uint16_t>& host) {
  ASSIGN_OR_RETURN(buf, DeviceBuffer::Allocate(host.size() * 2));
  RETURN_IF_ERROR(CopyToDevice(buf.data(), host.data(), host.size() * 2));
  return buf;
}

absl::StatusOr<DeviceBuffer> UploadBf16(const model::Model& m,
                                        const std::vector<std::string>& names) {
  std::vector<uint16_t> host;
  for (const std::string& n : names) RETURN_IF_ERROR(AppendBf16(m, n, &host));
  return ToDevice(host);
}

// The fused gate_up weight [2 I, H]: rows in blocks of 8 gate rows then the same 8 up rows (the
// layout SiluMul and DecodeGemmSiluMul read, ops.h), so a GEMM output row holds each feature's
// gate and up values 8 columns apart and a DecodeGemm CTA of 16 or 32 rows holds whole pairs.
absl::StatusOr<DeviceBuffer> UploadGateUp(const model::Model& m, const std::string& gate,
                                          const std::string& up, int64_t inter, int64_t hidden) {
  std::vector<uint16_t> g, u;
  RETURN_IF_ERROR(AppendBf16(m, gate, &g));
  RETURN_IF_ERROR(AppendBf16(m, up, &u));
  if (static_cast<int64_t>(g.size()) != inter * hidden || g.size() != u.size() || inter % 8) {
    return absl::InvalidArgumentError(absl::StrCat("cuda backend: ", gate, " / ", up,
                                                   " are not two [", inter, ", ", hidden,
                                                   "] weights with ", inter, " a multiple of 8"));
  }
  std::vector<uint16_t> host(g.size() * 2);
  const size_t block = 8 * static_cast<size_t>(hidden);
  for (size_t b = 0; b * block < g.size(); ++b) {
    std::copy_n(g.begin() + b * block, block, host.begin() + 2 * b * block);
    std::copy_n(u.begin() + b * block, block, host.begin() + (2 * b + 1) * block);
  }
  return ToDevice(host);
}

struct Layer {
  DeviceBuffer input_norm, post_norm, q_norm, k_norm;
  DeviceBuffer wqkv;  // [(hq + 2 hkv) D, H]: q, k, v projections stacked
  DeviceBuffer wo;    // [H, hq D]
  DeviceBuffer wgu;   // [2 I, H]: blocks of 8 gate rows, then the same 8 up rows (UploadGateUp)
  DeviceBuffer wd;    // [H, I]
  DeviceBuffer k_cache, v_cache;
};

// Page-locked host memory (cudaMallocHost), so the per-step copies are true async DMA.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (p_ != nullptr) cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  absl::Status Resize(size_t bytes) {
    if (p_ != nullptr) cudaFreeHost(p_);
    p_ = nullptr;
    size_ = 0;
    RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&p_, bytes), "cudaMallocHost"));
    size_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return size_; }

 private:
  void* p_ = nullptr;
  size_t size_ = 0;
};

// Device pointers to one step's metadata (eager: the packed upload; graph: the fixed layout).
struct StepMeta {
  const int32_t* tokens = nullptr;           // [n]
  const int32_t* positions = nullptr;        // [n]
  const int32_t* slots = nullptr;            // [n]
  const int32_t* block_ids = nullptr;        // [block_table_start[num_seqs]]
  const int32_t* logits_rows = nullptr;      // [rows]
  const RowSampleParams* samples = nullptr;  // [rows] or nullptr: no device sampling
  const int32_t* penalty = nullptr;          // the penalty tokens the samples index
  const int32_t* counts = nullptr;           // their generated counts (parallel)
  const float* bias = nullptr;               // their logit biases (parallel)
  bool score_rows = false;                   // some of samples is a score row (eager steps only)
  AttentionPlanView plan;
};

// One captured decode step: a graph over `bucket` rows and the buffers it was captured with.
// One per split kernel form (AttentionPlanView::split_form), captured when a step first needs it.
struct DecodeGraph {
  // AttentionPlanView::split_form, and after wide cascade items 4: the register form, 5: the
  // shared-memory form (SplitForm 0), 6: the persistent decode kernel (SplitForm 6).
  static constexpr int kForms = 7;
  cudaGraphExec_t exec[kForms] = {};
  uint64_t epoch[kForms] = {};  // CudaBackend::graph_epoch_ at capture
  // Just captured, the same step with the pinned GEMM algorithms where exec holds tuned ones
  // (gemm.h): both are timed on the step's first replay and the slower is dropped.
  cudaGraphExec_t pinned[kForms] = {};
  bool Current(uint64_t e) const {
    for (int f = 0; f < kForms; ++f) {
      if (exec[f] != nullptr && epoch[f] == e) return true;
    }
    return false;
  }
  ~DecodeGraph() {
    for (cudaGraphExec_t x : exec) {
      if (x != nullptr) cudaGraphExecDestroy(x);
    }
    for (cudaGraphExec_t x : pinned) {
      if (x != nullptr) cudaGraphExecDestroy(x);
    }
  }
};

class CudaBackend final : public engine::Backend {
 public:
  CudaBackend(const model::ModelConfig& c, const CudaBackendOptions& o) : c_(c), o_(o) {}
  ~CudaBackend() override {
    // (A started step may still write into the pinned buffers.)
    if (stream_ != nullptr) cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream_));
    for (cudaEvent_t e : results_ready_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    graphs_.clear();
    if (copy_stream_ != nullptr) {
      cudaStreamSynchronize(copy_stream_);
      cudaStreamDestroy(copy_stream_);
    }
    if (compute_done_ != nullptr) cudaEventDestroy(compute_done_);
    if (copies_done_ != nullptr) cudaEventDestroy(copies_done_);
    for (const AheadCopy& a : ahead_inflight_) cudaEventDestroy(a.done);
    for (cudaEvent_t e : ahead_events_) cudaEventDestroy(e);
    if (prefetch_stream_ != nullptr) {
      cudaStreamSynchronize(prefetch_stream_);
      cudaStreamDestroy(prefetch_stream_);
    }
    if (prefetch_fork_ != nullptr) cudaEventDestroy(prefetch_fork_);
    if (prefetch_join_ != nullptr) cudaEventDestroy(prefetch_join_);
    if (stream_ != nullptr) cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream_));
  }

  absl::Status Init(const model::Model& m);
  absl::StatusOr<std::string> KvNumericsOf();  // see its definition
  // A layer's four projections (layer 0's weights; every layer has the same shapes): qkv_proj,
  // o_proj, gate_up, down_proj, each y[m, n] = x[m, k] w^T.
  struct Projection {
    const Bf16* w;
    int n, k;
    GemmOut out;
  };
  std::array<Projection, 4> Projections() const {
    const Layer& l = layers_[0];
    return {{{l.wqkv.as<Bf16>(), qkv_cols_, hidden_, GemmOut::kBf16},
             {l.wo.as<Bf16>(), hidden_, hq_ * d_, GemmOut::kBf16},
             {l.wgu.as<Bf16>(), 2 * inter_, hidden_, GemmOut::kBf16},
             {l.wd.as<Bf16>(), hidden_, inter_, GemmOut::kBf16}}};
  }

  std::string Name() const override { return "cuda"; }
  std::string KvNumerics() const override { return kv_numerics_; }
  CudaGraphStats graph_stats() const {
    CudaGraphStats st{graph_captures_, graph_replays_, gemm_->small_verified(),
                      gemm_->small_rejected()};
    st.o_proj_splits = o_splits_;
    st.down_proj_splits = down_splits_;
    st.graphs_tuned_kept = tuned_kept_;
    st.graphs_tuned_dropped = tuned_dropped_;
    st.wide_cascade_steps = wide_steps_;
    st.replay_host = replay_host_;
    st.first_steps_ns = first_steps_ns_;
    st.captured_at_load = captured_at_load_;
    st.speculated_adopted = speculated_adopted_;
    st.speculated_dropped = speculated_dropped_;
    st.eager_deferred = eager_deferred_;
    st.speculated_after_eager = speculated_after_eager_;
    for (int i = 0; i < 10; ++i) st.speculate_refused[i] = speculate_refused_[i];
    st.load_capture_ms = load_capture_ms_;
    st.load_capture_log = load_capture_log_;
    st.captures_ns = captures_ns_;
    st.prefill_attention_log = prefill_form_log_;
    // "m=.. n=.. k=.. bf16: N candidates, E bitwise equal, pinned .. us (algo), best equal .."
    auto line = [](const Gemm::TuneRecord& r, bool with_m) {
      return absl::StrFormat(
          "%sn=%d k=%d %s: %d candidates, %d bitwise equal, pinned %.1f us (%s), best equal %.1f "
          "us (%s)%s",
          with_m ? absl::StrCat("m=", r.m, " ") : "", r.n, r.k, r.f32 ? "f32" : "bf16",
          r.candidates, r.equal, r.pinned_us, r.pinned_algo, r.best_us, r.best_algo,
          r.replaced ? " (replaced)" : "");
    };
    for (const Gemm::TuneRecord& r : gemm_->tune_log()) {
      ++st.gemm_tuned;
      st.gemm_replaced += r.replaced ? 1 : 0;
      st.gemm_tune_log.push_back(line(r, true));
    }
    for (const Gemm::TuneRecord& r : gemm_->prefill_log()) {
      ++st.gemm_prefill_shapes;
      st.gemm_prefill_replaced += r.replaced ? 1 : 0;
      st.gemm_prefill_log.push_back(line(r, false));
    }
    st.gemm_decode_log = gemm_->decode_log();
    return st;
  }
  int64_t NumBlocks() const override { return num_blocks_; }
  int BlockSize() const override { return o_.block_size; }
  int VocabSize() const override { return static_cast<int>(c_.vocab_size); }
  absl::Status Forward(const engine::ForwardBatch& batch, std::vector<float>* logits) override {
    return Run(batch, /*sampled=*/false, logits, nullptr, nullptr);
  }
  // Rows are sampled on the device (sample.cu): a token id (and up to 21 logprobs) back instead
  // of a vocabulary-sized float32 row (608 KB for Qwen3), which made decode host-bound.
  absl::Status ForwardSampled(const engine::ForwardBatch& batch, std::vector<float>* logits,
                              std::vector<int32_t>* argmax,
                              std::vector<engine::RowLogprobs>* logprobs) override {
    return Run(batch, /*sampled=*/true, logits, argmax, logprobs);
  }

  // Overlapped schedule: a decode step that replays a captured graph (every row sampled on the
  // device) returns once it is enqueued, its token ids and logprobs copied on the stream into
  // pinned buffers; FinishSampled waits for them. Any other step runs whole in LaunchSampled.
  absl::Status LaunchSampled(const engine::ForwardBatch& batch) override {
    if (async_.active) return absl::FailedPreconditionError("LaunchSampled: a step is in flight");
    if (started_.active && engine::SameBatchButFed(batch, started_.next, started_.feed)) {
      started_.active = false;
      async_ = Async{};
      async_.active = true;
      async_.deferred_rows = started_.deferred_rows;
      async_.slot = started_.slot;
      std::swap(pad_, started_pad_);  // (CompleteDeferred reads the step's row specs there)
      ++speculated_adopted_;
      return absl::OkStatus();
    }
    // (A started step of another batch: Run waits for it and drops it.)
    async_ = Async{};
    async_.active = true;
    slot_ = 1 - slot_;  // (the other half's last step was collected)
    async_.slot = slot_;
    defer_sync_ = true;
    async_.status = Run(batch, /*sampled=*/true, &async_.logits, &async_.tokens, &async_.logprobs);
    defer_sync_ = false;
    return absl::OkStatus();
  }
  absl::Status FinishSampled(std::vector<float>* logits, std::vector<int32_t>* tokens,
                             std::vector<engine::RowLogprobs>* logprobs) override {
    if (!async_.active) return absl::FailedPreconditionError("FinishSampled: nothing in flight");
    async_.active = false;
    if (async_.status.ok() && async_.deferred_rows >= 0) {
      async_.status =
          CompleteDeferred(async_.deferred_rows, async_.slot, &async_.tokens, &async_.logprobs);
    }
    logits->swap(async_.logits);
    tokens->swap(async_.tokens);
    if (logprobs != nullptr) logprobs->swap(async_.logprobs);
    return async_.status;
  }
  // CudaBackendOptions::speculative_launch: the overlapped engine's next step enqueued behind the
  // decode graph step in flight, its fed inputs taken from that step's sampled ids on the device
  // (engine::Backend::PrepareSampled). Only pure decode steps every row of which is sampled on
  // the device, without penalty lists, whose bucket's graph for their attention form is captured
  // and whose metadata fits its buffers; false otherwise (nothing started).
  bool PrepareSampled(const engine::ForwardBatch& next, std::span<const int32_t> feed) override;

  // Block I/O (host KV tier). A block's host copy is [layer][K, V][hkv, block_size, D] bf16.
  int64_t KvBlockBytes() const override { return 2 * c_.num_hidden_layers * PartBytes(); }
  absl::StatusOr<engine::HostKvMemory> AllocateHostKv(size_t bytes) override;
  absl::Status CopyBlocksToHost(std::span<const engine::BlockCopy> copies) override {
    return CopyBlocks(copies, /*to_host=*/true);
  }
  absl::Status CopyBlocksFromHost(std::span<const engine::BlockCopy> copies) override {
    return CopyBlocks(copies, /*to_host=*/false);
  }
  absl::Status WaitBlockCopies() override {
    if (copy_stream_ == nullptr) return absl::OkStatus();
    return CudaStatus(cudaStreamSynchronize(copy_stream_), "cudaStreamSynchronize(copy)");
  }
  absl::StatusOr<uint64_t> CopyBlocksToHostAhead(
      std::span<const engine::BlockCopy> copies) override;
  uint64_t AheadCopiesDone() override;
  absl::Status OrderAfterAheadCopies(uint64_t ticket) override;

 private:
  // Bytes of one block in one layer's K (or V) cache.
  int64_t PartBytes() const { return int64_t{hkv_} * o_.block_size * d_ * 2; }
  // Enqueues block copies on copy_stream_ after the compute stream's work so far; unless
  // `ahead`, the next Run() makes the compute stream wait for them (copies_pending_).
  absl::Status CopyBlocks(std::span<const engine::BlockCopy> copies, bool to_host,
                          bool ahead = false);
  absl::Status InitBlockCopies();
  absl::Status Check(const engine::ForwardBatch& b) const;
  absl::Status Run(const engine::ForwardBatch& b, bool sampled, std::vector<float>* logits,
                   std::vector<int32_t>* argmax, std::vector<engine::RowLogprobs>* logprobs);
  // deferred (LaunchSampled, CudaBackendOptions::defer_eager_steps): where every row is sampled
  // on the device and none is a score row, the step is left in flight: its results are copied
  // into slot_'s pinned half (DeferResults) and *deferred is set to its rows.
  absl::Status RunEager(const engine::ForwardBatch& b, bool sampled, std::vector<float>* logits,
                        std::vector<int32_t>* argmax, std::vector<engine::RowLogprobs>* logprobs,
                        int* deferred = nullptr);
  // A step left in flight: its n rows' sampled ids (argmax_; unless ids_copied, the caller
  // enqueued that copy) and, where asked, logprobs (lp_) copied into slot_'s pinned halves after
  // it, results_ready_[slot_] recorded after the copies; which rows want logprobs kept for
  // CompleteDeferred.
  absl::Status DeferResults(const std::vector<engine::RowSample>& samples, int n, bool ids_copied);
  // Uploads a step's penalty tokens, counts and biases (to penalty_, penalty_counts_,
  // penalty_bias_) before its sampling kernel runs.
  absl::Status UploadPenalties(const engine::ForwardBatch& b);
  // Copies back the logprobs of the first n rows where a device-sampled row asked for them.
  absl::Status FetchLogprobs(const engine::ForwardBatch& b, int n,
                             std::vector<engine::RowLogprobs>* logprobs);
  // The attention plan of the first n rows of `b` (one per step, shared by every layer).
  absl::Status PlanStep(const engine::ForwardBatch& b, int n, AttentionPlan* plan) const;
  // Enqueues embedding, the decoder layers and the final norm over n rows (into x_).
  absl::Status EnqueueModel(int n, const StepMeta& m);
  // Enqueues the LM head (and device sampling if m.samples) for logits rows [r0, r0 + rows).
  absl::Status EnqueueHead(int r0, int rows, const StepMeta& m);
  // Grows buf to at least `bytes` (doubling); where graphs_read_it, the growth re-captures every
  // decode graph on its next use (they hold the old pointer). The eager steps' own buffers (their
  // metadata and sampling specs) grow without it, so a long prefill keeps the graphs captured at
  // load.
  absl::Status EnsureCapacity(DeviceBuffer* buf, size_t bytes, bool graphs_read_it = true);
  // Decode graphs (cuda_graphs option).
  int GraphBucket(int n) const;
  // The buckets of batches of 1 to n rows, ascending.
  std::vector<int> GraphBuckets(int n) const {
    std::vector<int> buckets;
    for (int i = 1; i <= n; ++i) {
      if (buckets.empty() || buckets.back() != GraphBucket(i)) buckets.push_back(GraphBucket(i));
    }
    return buckets;
  }
  void PadDecodeBatch(const engine::ForwardBatch& b, bool sampled, int bucket);
  // Replays (or first captures) the bucket's graph over pad_, its host buffers in half slot_.
  // deferred: non-null where a step whose rows are all sampled on the device may be left in
  // flight (its row count stored there; CompleteDeferred finishes it). planned: pad_'s plan
  // (PlanStep) where the caller made it already, taken over; null: planned here.
  absl::Status RunDecodeGraph(int n, int bucket, std::vector<float>* logits,
                              std::vector<int32_t>* argmax,
                              std::vector<engine::RowLogprobs>* logprobs, int* deferred = nullptr,
                              AttentionPlan* planned = nullptr);
  absl::Status CaptureDecodeGraph(int bucket, int form, const StepMeta& m, DecodeGraph* g);
  // The DecodeGraph slot a decode plan replays: its split form, and after wide cascade items 4, 5
  // or 6 (a graph of their own, which also launches the wgmma kernel over them).
  int GraphForm(const AttentionPlan& plan) const {
    const int split_form = SplitForm(plan, d_, hq_ / hkv_);
    return plan.num_wide > 0 ? (split_form == 1 ? 4 : split_form == 6 ? 6 : 5) : split_form;
  }
  // Whether a decode plan over `blocks` block ids replays g as captured: its form's graph current
  // and already timed against the pinned one, and no buffer it needs to grow (PrepareSampled
  // starts only such steps: growing or capturing would wait for the step in flight).
  bool GraphReady(const DecodeGraph& g, const AttentionPlan& plan, int64_t blocks) const;
  // CudaBackendOptions::capture_graphs_at_load: decode steps of every bucket over scratch rows
  // (the KV cache zeroed first, then written by them; nothing is cached yet at load).
  absl::Status CaptureGraphsAtLoad();
  // A graph captured with tuned GEMMs beside one with the pinned algorithms: times replays of
  // both (the step's metadata staged) and keeps the faster.
  absl::Status PickTunedOrPinned(DecodeGraph* g, int form);
  // The host half of a decode graph step LaunchSampled left in flight (n rows of pad_, its
  // results in half `slot`).
  absl::Status CompleteDeferred(int n, int slot, std::vector<int32_t>* tokens,
                                std::vector<engine::RowLogprobs>* logprobs);

  // Set at construction.
  const model::ModelConfig c_;
  const CudaBackendOptions o_;
  int hq_ = 0, hkv_ = 0, d_ = 0, hidden_ = 0, inter_ = 0, qkv_cols_ = 0;
  int o_splits_ = 1, down_splits_ = 1;  // Gemm::Splits of o_proj and down_proj
  int64_t num_blocks_ = 0;
  Stream stream_ = nullptr;
  std::string prefill_form_log_;  // TunePrefillForm's choice at load
  std::unique_ptr<Gemm> gemm_;
  std::vector<Layer> layers_;
  DeviceBuffer embed_, final_norm_, lm_head_storage_;
  const Bf16* lm_head_ = nullptr;
  DeviceBuffer inv_freq_;
  // Activations, [max_num_tokens, ...].
  DeviceBuffer residual_, x_, qkv_, attn_, delta_, gu_, act_, xl_, logits_;
  // Grown on demand.
  DeviceBuffer meta_, partial_o_, partial_ml_, argmax_, sample_params_;
  DeviceBuffer penalty_;         // [tokens] int32: the step's penalty tokens
  DeviceBuffer penalty_counts_;  // [tokens] int32: their generated counts, where any row has them
  DeviceBuffer penalty_bias_;    // [tokens] float: their logit biases, where any row has them
  DeviceBuffer ws_work_;  // [2] int32: the persistent decode kernel's work counter (zeroed once)
  DeviceBuffer lp_;       // [rows] engine::RowLogprobs
  std::vector<engine::RowLogprobs> lp_host_;
  std::vector<int32_t> argmax_host_;
  std::vector<RowSampleParams> sample_host_;
  std::vector<int32_t> meta_host_;
  // Decode graphs: fixed-layout metadata (int32 units; segments in GraphLayout order), its
  // pinned host staging, the captured graphs by bucket. graph_epoch_ moves whenever a buffer a
  // graph reads or writes is reallocated; graphs of older epochs are re-captured.
  int max_graph_batch_ = 0, split_ctas_ = 0, split_ctas_reg_ = 0, ws_ctas_ = 0, super_tiles_ = 1;
  int wide_ctas_ = 0;  // the wide cascade kernel's schedule CTAs (AttentionConfig::wide_ctas)
  std::string kv_numerics_ = "cuda";        // KvNumerics(), set by Init
  int wide_rows_ = 0;                       // AttentionConfig::wide_rows (WideCascadeRows)
  int64_t wide_steps_ = 0;                  // steps whose plan had wide cascade items
  int tuned_kept_ = 0, tuned_dropped_ = 0;  // PickTunedOrPinned's verdicts
  int64_t cap_blocks_ = 0, cap_items_ = 0, cap_rows_ = 0;
  DeviceBuffer graph_meta_;
  PinnedBuffer graph_host_[2], graph_tokens_host_[2];
  uint64_t graph_epoch_ = 1;
  std::map<int, std::unique_ptr<DecodeGraph>> graphs_;
  engine::ForwardBatch pad_;  // the step padded to its bucket (without its penalty lists:)
  const engine::ForwardBatch* pad_penalty_ = nullptr;  // the caller's, for the graph step
  int64_t graph_replays_ = 0, graph_captures_ = 0;
  CudaGraphStats::ReplayHost replay_host_;  // summed over graph_replays_
  int64_t check_ns_ = 0;                    // this step's Check (counted if it replays a graph)
  int64_t pad_ns_ = 0;                      // when this step's PadDecodeBatch began
  int64_t first_steps_ns_ = 0, captures_ns_ = 0;  // CudaGraphStats
  int64_t captured_at_load_ = 0;
  double load_capture_ms_ = 0;
  std::string load_capture_log_;  // why the load's captures stopped early; empty if they did not
  // LaunchSampled's step: its results, or (deferred_rows >= 0) a graph step still in flight.
  struct Async {
    bool active = false;
    int deferred_rows = -1;
    bool eager = false;  // an eager step left in flight (CudaBackendOptions::defer_eager_steps)
    int slot = 0;        // the staging and result buffers' half it uses (slot_)
    absl::Status status;
    std::vector<float> logits;
    std::vector<int32_t> tokens;
    std::vector<engine::RowLogprobs> logprobs;
  };
  Async async_;
  bool defer_sync_ = false;  // inside LaunchSampled: a graph step may return unfinished
  // Per slot: which rows of the step deferred there want their logprobs (CompleteDeferred).
  std::vector<uint8_t> deferred_lp_[2];
  // [max_graph_batch] engine::RowLogprobs, for deferred steps, a half per slot.
  PinnedBuffer lp_pinned_[2];
  // Two halves of the graph steps' host buffers (staging, token ids, logprobs) and an event after
  // each half's result copies, so a step can be enqueued while the one before it is in flight
  // (PrepareSampled); slot_: the half of the step launched last.
  cudaEvent_t results_ready_[2] = {nullptr, nullptr};
  int slot_ = 0;
  // PrepareSampled's step: the batch as offered (for LaunchSampled's comparison), its feed, and
  // its deferred rows and half; started_pad_ its padded batch (pad_'s while it is in flight).
  struct Started {
    bool active = false;
    engine::ForwardBatch next;
    std::vector<int32_t> feed;
    int deferred_rows = -1;
    int slot = 0;
    std::vector<float> logits;  // (none: every row is sampled on the device)
    std::vector<int32_t> tokens;
    std::vector<engine::RowLogprobs> logprobs;
  };
  Started started_;
  engine::ForwardBatch started_pad_;
  std::span<const int32_t> feed_;  // set while RunDecodeGraph stages a started step
  int64_t speculated_adopted_ = 0, speculated_dropped_ = 0;  // CudaGraphStats
  int64_t eager_deferred_ = 0, speculated_after_eager_ = 0;  // CudaGraphStats
  int64_t speculate_refused_[10] = {};                       // CudaGraphStats
  // Block I/O, created on first use: a copy stream ordered against stream_ by two events, the
  // per-layer cache bases on the device ([2 layers]: K then V of each layer) and a dense staging
  // buffer of stage_blocks_ whole blocks.
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr, copies_done_ = nullptr;
  DeviceBuffer kv_parts_, kv_stage_;
  int stage_blocks_ = 0;
  bool copies_pending_ = false;  // copies enqueued that the compute stream has not waited for
  // Copies ahead of eviction (CopyBlocksToHostAhead) not yet seen done, oldest first, each with
  // the event recorded after it on copy_stream_; spent events are kept for reuse.
  struct AheadCopy {
    uint64_t ticket;
    cudaEvent_t done;
  };
  std::vector<AheadCopy> ahead_inflight_;
  std::vector<cudaEvent_t> ahead_events_;
  uint64_t ahead_issued_ = 0, ahead_done_ = 0;
  // L2 prefetches of weights (CudaBackendOptions::prefetch_weights_max_rows): a side stream forked
  // from stream_ where a prefetch is issued and joined back at the end of EnqueueModel.
  cudaStream_t prefetch_stream_ = nullptr;
  // prefetch_weights_max_rows where a prefetch's weights fit the L2 cache, else 0 (Init).
  int prefetch_max_rows_ = 0;
  cudaEvent_t prefetch_fork_ = nullptr, prefetch_join_ = nullptr;
};

absl::StatusOr<engine::HostKvMemory> CudaBackend::AllocateHostKv(size_t bytes) {
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(o_.device), "cudaSetDevice"));
  void* p = nullptr;
  absl::Status st = CudaStatus(cudaMallocHost(&p, std::max<size_t>(bytes, 1)), "cudaMallocHost");
  if (!st.ok()) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot pin ", bytes, " bytes of host KV memory: ", st.message()));
  }
  return engine::HostKvMemory(static_cast<std::byte*>(p),
                              engine::HostKvDeleter{[](void* q) { cudaFreeHost(q); }});
}

absl::Status CudaBackend::InitBlockCopies() {
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "copy stream"));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming),
                             "cudaEventCreate"));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&copies_done_, cudaEventDisableTiming),
                             "cudaEventCreate"));
  std::vector<void*> parts;
  for (Layer& l : layers_) {
    parts.push_back(l.k_cache.data());
    parts.push_back(l.v_cache.data());
  }
  ASSIGN_OR_RETURN(pbuf, DeviceBuffer::Allocate(parts.size() * sizeof(void*)));
  RETURN_IF_ERROR(CopyToDevice(pbuf.data(), parts.data(), parts.size() * sizeof(void*)));
  kv_parts_ = std::move(pbuf);
  // About 64 MB of staging: large copies run at full PCIe bandwidth, and a launch takes at most
  // kMaxKvBlocksPerCopy blocks anyway.
  constexpr int64_t kStageBytes = int64_t{64} << 20;
  stage_blocks_ =
      static_cast<int>(std::clamp<int64_t>(kStageBytes / KvBlockBytes(), 1, kMaxKvBlocksPerCopy));
  ASSIGN_OR_RETURN(stage, DeviceBuffer::Allocate(stage_blocks_ * KvBlockBytes()));
  kv_stage_ = std::move(stage);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CudaBackend::CopyBlocksToHostAhead(
    std::span<const engine::BlockCopy> copies) {
  RETURN_IF_ERROR(CopyBlocks(copies, /*to_host=*/true, /*ahead=*/true));
  if (copy_stream_ == nullptr) {  // (no copies: CopyBlocks made no stream)
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(o_.device), "cudaSetDevice"));
    RETURN_IF_ERROR(InitBlockCopies());
  }
  cudaEvent_t e = nullptr;
  if (!ahead_events_.empty()) {
    e = ahead_events_.back();
    ahead_events_.pop_back();
  } else {
    RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
  }
  if (absl::Status st = CudaStatus(cudaEventRecord(e, copy_stream_), "cudaEventRecord"); !st.ok()) {
    ahead_events_.push_back(e);
    return st;
  }
  ahead_inflight_.push_back({++ahead_issued_, e});
  return ahead_issued_;
}

uint64_t CudaBackend::AheadCopiesDone() {
  size_t i = 0;
  for (; i < ahead_inflight_.size(); ++i) {
    const cudaError_t q = cudaEventQuery(ahead_inflight_[i].done);
    if (q == cudaErrorNotReady) break;
    // (An error is sticky and shows in the next step's status; the copy is not waited for.)
    if (q != cudaSuccess) cudaGetLastError();
    ahead_done_ = ahead_inflight_[i].ticket;
    ahead_events_.push_back(ahead_inflight_[i].done);
  }
  ahead_inflight_.erase(ahead_inflight_.begin(), ahead_inflight_.begin() + i);
  return ahead_done_;
}

absl::Status CudaBackend::OrderAfterAheadCopies(uint64_t ticket) {
  for (const AheadCopy& a : ahead_inflight_) {
    if (a.ticket < ticket) continue;
    // The copy stream runs in order, so this ticket's event covers every earlier one.
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(o_.device), "cudaSetDevice"));
    return CudaStatus(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream_), a.done, 0),
                      "cudaStreamWaitEvent(ahead copies)");
  }
  return absl::OkStatus();  // done already
}

absl::Status CudaBackend::CopyBlocks(std::span<const engine::BlockCopy> copies, bool to_host,
                                     bool ahead) {
  RETURN_IF_ERROR(engine::ValidateBlockCopies(copies, num_blocks_));
  if (copies.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(o_.device), "cudaSetDevice"));
  if (copy_stream_ == nullptr) RETURN_IF_ERROR(InitBlockCopies());
  // After everything the compute stream has been given (Forward synchronizes before it returns,
  // so this is normally already done; the event makes the order explicit).
  const auto compute = reinterpret_cast<cudaStream_t>(stream_);
  RETURN_IF_ERROR(CudaStatus(cudaEventRecord(compute_done_, compute), "cudaEventRecord"));
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamWaitEvent(copy_stream_, compute_done_, 0), "cudaStreamWaitEvent"));
  const int64_t block_bytes = KvBlockBytes();
  const int num_parts = 2 * static_cast<int>(layers_.size());
  auto* stage = kv_stage_.as<std::byte>();
  const auto kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  for (size_t c0 = 0; c0 < copies.size(); c0 += stage_blocks_) {
    const int n = static_cast<int>(std::min<size_t>(stage_blocks_, copies.size() - c0));
    KvBlockList list;
    for (int i = 0; i < n; ++i) list.ids[i] = copies[c0 + i].block;
    if (to_host) {
      RETURN_IF_ERROR(CopyKvBlocks(kv_parts_.as<void*>(), num_parts, list, n, PartBytes(), stage,
                                   /*to_stage=*/true, copy_stream_));
    }
    for (int i = 0; i < n; ++i) {
      std::byte* dense = stage + i * block_bytes;
      std::byte* host = copies[c0 + i].host;
      RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(to_host ? host : dense, to_host ? dense : host,
                                                 block_bytes, kind, copy_stream_),
                                 "cudaMemcpyAsync(KV block)"));
    }
    if (!to_host) {
      RETURN_IF_ERROR(CopyKvBlocks(kv_parts_.as<void*>(), num_parts, list, n, PartBytes(), stage,
                                   /*to_stage=*/false, copy_stream_));
    }
  }
  if (ahead) return absl::OkStatus();  // (CopyBlocksToHostAhead records its own event)
  RETURN_IF_ERROR(CudaStatus(cudaEventRecord(copies_done_, copy_stream_), "cudaEventRecord"));
  copies_pending_ = true;
  return absl::OkStatus();
}

// Bumped whenever a change to this backend's kernels changes the bits of KV blocks or logits under
// unchanged settings, so workers of different builds do not exchange blocks.
constexpr int kKvNumericsVersion = 1;

// FNV-1a, 64 bits: a stable digest (absl::Hash is not stable across processes).
uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// "cuda/v1/G1/0123456789abcdef": the numerics version, the fold order's super-tile size, and a
// digest of what fixes the projections' bits (the device's compute capability, cuBLASLt's
// version, each shape's pinned algorithm and split count). The attention kernels' bits depend on
// the fold order only (every kernel form of one order gives the same bits). Heuristic mode
// ("cuda/v1/heuristic/G1") has no fixed algorithm to digest.
absl::StatusOr<std::string> CudaBackend::KvNumericsOf() {
  std::string prefix = absl::StrCat("cuda/v", kKvNumericsVersion, "/",
                                    o_.batch_invariant ? "" : "heuristic/", "G", super_tiles_);
  if (!o_.batch_invariant || layers_.empty()) return prefix;
  int major = 0, minor = 0;
  RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, o_.device), "device"));
  RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, o_.device), "device"));
  std::string what = absl::StrCat("sm ", major, ".", minor);
  for (const Projection& p : Projections()) {
    ASSIGN_OR_RETURN(one, gemm_->PinnedNumerics(p.n, p.k, p.out));
    absl::StrAppend(&what, "; ", one);
  }
  return absl::StrCat(prefix, "/", absl::Hex(Fnv1a(what), absl::kZeroPad16));
}

absl::Status CudaBackend::Init(const model::Model& m) {
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(o_.device), "cudaSetDevice"));
  cudaStream_t s;
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream"));
  stream_ = reinterpret_cast<Stream>(s);
  hq_ = static_cast<int>(c_.num_attention_heads);
  hkv_ = static_cast<int>(c_.num_key_value_heads);
  d_ = static_cast<int>(c_.head_dim);
  hidden_ = static_cast<int>(c_.hidden_size);
  inter_ = static_cast<int>(c_.intermediate_size);
  // The L2 prefetch only where what one prefetch hints fits the device's L2 (cuda_defaults.h
  // PrefetchFitsL2).
  {
    int l2 = 0;
    RETURN_IF_ERROR(
        CudaStatus(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, o_.device), "device"));
    prefetch_max_rows_ = PrefetchFitsL2(hidden_, int64_t{hq_} * d_, int64_t{hkv_} * d_, inter_, l2)
                             ? o_.prefetch_weights_max_rows
                             : 0;
  }
  if (prefetch_max_rows_ > 0) {
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&prefetch_stream_, cudaStreamNonBlocking),
                               "prefetch stream"));
    for (cudaEvent_t* e : {&prefetch_fork_, &prefetch_join_}) {
      RETURN_IF_ERROR(
          CudaStatus(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate"));
    }
  }
  qkv_cols_ = (hq_ + 2 * hkv_) * d_;
  if (d_ != 32 && d_ != 64 && d_ != 128 && d_ != 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: head_dim ", d_, " not supported (32, 64, 128, 256)"));
  }
  if (hidden_ % 8 || inter_ % 8 || c_.vocab_size % 8) {
    return absl::InvalidArgumentError(
        "cuda backend: hidden, intermediate and vocab sizes must be "
        "multiples of 8");
  }
  SetProgrammaticLaunch(o_.programmatic_launch);
  SetDecodeGemmEarlyChunks(o_.decode_gemm_early_chunks);
  ASSIGN_OR_RETURN(gemm, Gemm::Create(o_.batch_invariant, o_.gemm_reference_m, o_.small_m_gemm,
                                      o_.split_k, o_.split_columns));
  gemm_ = std::move(gemm);
  gemm_->set_split_residual_n(hidden_, o_.split_residual_min);
  gemm_->set_decode_max_m(o_.decode_gemm_max_m);
  // Captured decode steps of up to prefetch_weights_max_rows rows find their weights in L2.
  gemm_->set_decode_warm_max_m(o_.cuda_graphs && o_.decode_gemm_choice_warm ? prefetch_max_rows_
                                                                            : 0);
  gemm_->set_decode_choose_small(o_.decode_gemm_choose_small);
  gemm_->set_decode_vocab(o_.decode_gemm_lm_head);
  gemm_->set_prefill_min_m(o_.gemm_prefill_min_m);
  o_splits_ = gemm_->Splits(hidden_, hq_ * d_);
  down_splits_ = gemm_->Splits(hidden_, inter_);

  ASSIGN_OR_RETURN(embed, UploadBf16(m, {"model.embed_tokens.weight"}));
  embed_ = std::move(embed);
  ASSIGN_OR_RETURN(fnorm, UploadBf16(m, {"model.norm.weight"}));
  final_norm_ = std::move(fnorm);
  if (c_.tie_word_embeddings) {
    lm_head_ = embed_.as<Bf16>();
  } else {
    ASSIGN_OR_RETURN(head, UploadBf16(m, {"lm_head.weight"}));
    lm_head_storage_ = std::move(head);
    lm_head_ = lm_head_storage_.as<Bf16>();
  }
  std::vector<float> inv = InvFreq(c_);
  ASSIGN_OR_RETURN(inv_buf, DeviceBuffer::Allocate(inv.size() * 4));
  RETURN_IF_ERROR(CopyToDevice(inv_buf.data(), inv.data(), inv.size() * 4));
  inv_freq_ = std::move(inv_buf);

  for (int64_t i = 0; i < c_.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer l;
#define UPLOAD(field, ...)                                \
  {                                                       \
    ASSIGN_OR_RETURN(buf_, UploadBf16(m, {__VA_ARGS__})); \
    l.field = std::move(buf_);                            \
  }
    UPLOAD(input_norm, p + "input_layernorm.weight");
    UPLOAD(post_norm, p + "post_attention_layernorm.weight");
    if (c_.qk_norm()) {
      UPLOAD(q_norm, p + "self_attn.q_norm.weight");
      UPLOAD(k_norm, p + "self_attn.k_norm.weight");
    }
    UPLOAD(wqkv, p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
           p + "self_attn.v_proj.weight");
    UPLOAD(wo, p + "self_attn.o_proj.weight");
    ASSIGN_OR_RETURN(gate_up, UploadGateUp(m, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                                           inter_, hidden_));
    l.wgu = std::move(gate_up);
    UPLOAD(wd, p + "mlp.down_proj.weight");
#undef UPLOAD
    layers_.push_back(std::move(l));
  }

  const size_t t = o_.max_num_tokens;
  auto alloc = [](DeviceBuffer* b, size_t bytes) -> absl::Status {
    ASSIGN_OR_RETURN(buf, DeviceBuffer::Allocate(bytes));
    *b = std::move(buf);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(alloc(&residual_, t * hidden_ * 4));
  RETURN_IF_ERROR(alloc(&x_, t * hidden_ * 2));
  RETURN_IF_ERROR(alloc(&qkv_, t * qkv_cols_ * 2));
  RETURN_IF_ERROR(alloc(&attn_, t * hq_ * d_ * 2));
  // delta_: o_proj / down_proj output, bf16, or their split-K partials [S, t, hidden] f32.
  const int max_splits = std::max(o_splits_, down_splits_);
  RETURN_IF_ERROR(alloc(&delta_, t * hidden_ * (max_splits > 1 ? 4 * max_splits : 2)));
  RETURN_IF_ERROR(alloc(&gu_, t * 2 * inter_ * 2));
  RETURN_IF_ERROR(alloc(&act_, t * inter_ * 2));
  RETURN_IF_ERROR(alloc(&xl_, static_cast<size_t>(o_.max_logits_rows) * hidden_ * 2));
  RETURN_IF_ERROR(alloc(&logits_, static_cast<size_t>(o_.max_logits_rows) * c_.vocab_size * 4));
  // Sampling: fixed pointers the decode graphs capture (penalty_ grows on demand).
  RETURN_IF_ERROR(alloc(&penalty_, size_t{1} << 16));
  RETURN_IF_ERROR(alloc(&penalty_counts_, size_t{1} << 16));
  RETURN_IF_ERROR(alloc(&penalty_bias_, size_t{1} << 16));
  RETURN_IF_ERROR(
      alloc(&lp_, static_cast<size_t>(o_.max_logits_rows) * sizeof(engine::RowLogprobs)));

  const size_t block_bytes = static_cast<size_t>(hkv_) * o_.block_size * d_ * 2;  // K or V
  num_blocks_ = o_.num_blocks;
  if (num_blocks_ == 0) {
    size_t free_b = 0, total_b = 0;
    RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"));
    num_blocks_ = static_cast<int64_t>(free_b * o_.kv_cache_fraction /
                                       (2.0 * block_bytes * c_.num_hidden_layers));
    if (num_blocks_ < 1) return absl::ResourceExhaustedError("cuda backend: no room for KV cache");
  }
  for (Layer& l : layers_) {
    RETURN_IF_ERROR(alloc(&l.k_cache, num_blocks_ * block_bytes));
    RETURN_IF_ERROR(alloc(&l.v_cache, num_blocks_ * block_bytes));
  }

  // One full wave of split CTAs: the graphs' split grid (a CTA beyond the wave would run its share
  // of items late) and what the planner sizes fold items by.
  // (Both forms' queries also set their kernels' shared-memory limits before any capture.)
  ASSIGN_OR_RETURN(ctas, SplitCtasPerWave(d_, hkv_, 0));
  split_ctas_ = ctas;
  ASSIGN_OR_RETURN(ctas_reg, SplitCtasPerWave(d_, hkv_, d_ <= 128 ? 1 : 0));
  split_ctas_reg_ = ctas_reg;
  // Where the persistent decode kernel can run (and is not turned off), the planner may fold
  // whole rows for it.
  SetDecodeWsMinTiles(o_.persistent_decode_min_tiles < 0 ? std::numeric_limits<int>::max()
                                                         : o_.persistent_decode_min_tiles);
  ASSIGN_OR_RETURN(ws_ctas, PersistentDecodeCtas(d_, hq_ / hkv_, o_.block_size));
  ws_ctas_ = o_.persistent_decode_min_tiles < 0 ? 0 : ws_ctas;
  wide_ctas_ = ws_ctas;
  ASSIGN_OR_RETURN(super_tiles, SuperTilesFor(d_, o_.block_size));
  if (o_.attention_super_tiles > 1 && super_tiles == 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention_super_tiles ", o_.attention_super_tiles,
        ": the two-level fold order needs head_dim 128, blocks of a multiple of 16 tokens and a "
        "Hopper GPU (compute capability 9.0); use 0 (automatic) or 1"));
  }
  super_tiles_ = o_.attention_super_tiles > 0 ? o_.attention_super_tiles : super_tiles;
  ASSIGN_OR_RETURN(wide_rows, WideCascadeRows(d_, hq_ / hkv_, o_.block_size));
  wide_rows_ = o_.cascade ? wide_rows : 0;
  RETURN_IF_ERROR(alloc(&ws_work_, 2 * sizeof(int32_t)));
  RETURN_IF_ERROR(FillBytes(ws_work_.data(), 0, ws_work_.size()));
  if (o_.cuda_graphs) {
    max_graph_batch_ = std::min({o_.max_graph_batch, o_.max_logits_rows, o_.max_num_tokens});
    // Room for every row at 2048 tokens of context before a regrowth re-captures the graphs.
    const int64_t tiles = 2048 / kTileTokens;
    cap_blocks_ = 2048 / o_.block_size * static_cast<int64_t>(max_graph_batch_);
    cap_items_ = cap_rows_ = tiles * max_graph_batch_;
    RETURN_IF_ERROR(alloc(&partial_o_, tiles * max_graph_batch_ * size_t{4} * hq_ * d_));
    RETURN_IF_ERROR(alloc(&partial_ml_, tiles * max_graph_batch_ * size_t{8} * hq_));
    for (int s = 0; s < 2; ++s) {
      RETURN_IF_ERROR(
          graph_tokens_host_[s].Resize(std::max(1, max_graph_batch_) * sizeof(int32_t)));
      RETURN_IF_ERROR(CudaStatus(
          cudaEventCreateWithFlags(&results_ready_[s], cudaEventDisableTiming), "cudaEventCreate"));
    }
    const bool tune =
        o_.gemm_tune || (o_.gemm_tune_min_hidden > 0 && hidden_ >= o_.gemm_tune_min_hidden);
    if (tune) {  // the m of every graph bucket (its first step runs eagerly at that m)
      gemm_->SetTuneSizes(GraphBuckets(std::min(max_graph_batch_, o_.gemm_tune_max_m)));
    }
  }
  // The decode-sized GEMM kernels of every bucket chosen now (gemm.h PrepareDecode; the layers
  // share their shapes), so no request pays for the choice's timing runs.
  if (!layers_.empty()) {
    const std::array<Projection, 4> projections = Projections();
    for (const Projection& s : projections) {
      RETURN_IF_ERROR(gemm_->PrepareDecode(s.w, s.n, s.k, s.out, stream_));
    }
    // (a no-op unless decode_gemm_lm_head)
    RETURN_IF_ERROR(gemm_->PrepareDecode(lm_head_, static_cast<int>(c_.vocab_size), hidden_,
                                         GemmOut::kF32, stream_));
    // The tuned algorithms of every decode bucket (when tuning is on) found now too, LM head
    // included: the first eager step of each bucket tuned them before, a one-off delay on an
    // early request.
    for (const Projection& s : projections) {
      RETURN_IF_ERROR(gemm_->PrepareTune(s.w, s.n, s.k, s.out, stream_));
    }
    RETURN_IF_ERROR(gemm_->PrepareTune(lm_head_, static_cast<int>(c_.vocab_size), hidden_,
                                       GemmOut::kF32, stream_));
    // The prefill chunks' algorithms (gemm.h PreparePrefill), so no request pays for the choice.
    for (const Projection& s : projections) {
      RETURN_IF_ERROR(gemm_->PreparePrefill(s.w, s.n, s.k, s.out, stream_));
    }
    gemm_->ReleaseTimingBuffers();  // 64 MB the serving loop does not need
  }
  ASSIGN_OR_RETURN(numerics, KvNumericsOf());
  kv_numerics_ = std::move(numerics);
  // Prefill attention's faster form on this device (attention.h TunePrefillForm; the same bits).
  if (o_.tune_prefill_attention) {
    constexpr int kTuneTokens = 4096;
    const int tokens = std::min(kTuneTokens, o_.max_num_tokens);
    absl::StatusOr<PrefillFormChoice> form =
        TunePrefillForm(HeadShape{hq_, hkv_, d_}, o_.block_size, tokens, stream_);
    // No room for its buffers beside the KV cache: keep the default form (the same bits).
    if (!form.ok() && !absl::IsResourceExhausted(form.status())) return form.status();
    prefill_form_log_ =
        form.ok() ? form->Describe(tokens)
                  : absl::StrCat("prefill attention: not timed (", form.status().message(), ")");
  }
  if (o_.cuda_graphs && o_.capture_graphs_at_load && max_graph_batch_ > 0 && !layers_.empty()) {
    RETURN_IF_ERROR(CaptureGraphsAtLoad());
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::CaptureGraphsAtLoad() {
  const int64_t t0 = NowNs();
  // Scratch rows read zeros, not whatever the allocation held (no NaN reaches the sampler).
  for (Layer& l : layers_) {
    RETURN_IF_ERROR(FillBytes(l.k_cache.data(), 0, l.k_cache.size()));
    RETURN_IF_ERROR(FillBytes(l.v_cache.data(), 0, l.v_cache.size()));
  }
  // (cudaMemset runs on the legacy stream, which stream_, non-blocking, does not wait for.)
  RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  const std::vector<int> buckets = GraphBuckets(max_graph_batch_);
  const int bs = o_.block_size;
  engine::ForwardBatch b;
  std::vector<float> logits;
  std::vector<int32_t> tokens;
  auto pass = [&]() -> absl::Status {
    for (const int len : {1, 2 * kTileTokens + 1, 8 * kTileTokens + 1, 32 * kTileTokens + 1}) {
      const int blocks_per_row = (len + bs - 1) / bs;
      for (const int n : buckets) {
        // Distinct blocks for every row: rows sharing blocks would plan cascade items instead.
        if (int64_t{n} * blocks_per_row > num_blocks_) continue;
        b = engine::ForwardBatch{};
        b.query_start.push_back(0);
        b.block_table_start.push_back(0);
        for (int r = 0; r < n; ++r) {
          const int32_t first = r * blocks_per_row;
          for (int i = 0; i < blocks_per_row; ++i) b.block_ids.push_back(first + i);
          b.token_ids.push_back(0);
          b.positions.push_back(len - 1);
          b.slot_mapping.push_back(b.block_ids[first + (len - 1) / bs] * bs + (len - 1) % bs);
          b.query_start.push_back(r + 1);
          b.context_lens.push_back(len);
          b.block_table_start.push_back(static_cast<int32_t>(b.block_ids.size()));
          b.logits_rows.push_back(r);
          b.row_samples.push_back(engine::RowSample{true, {}});  // greedy
        }
        RETURN_IF_ERROR(Run(b, /*sampled=*/true, &logits, &tokens, nullptr));
      }
    }
    return absl::OkStatus();
  };
  // A buffer the graphs read that grew during the pass (a scratch step's partials) left the graphs
  // captured before it stale: once more, at the grown sizes. Memory running out only ends the
  // captures early (the rest are captured on first use, as without this option).
  for (int i = 0; i < 2; ++i) {
    const uint64_t epoch = graph_epoch_;
    const absl::Status st = pass();
    if (absl::IsResourceExhausted(st)) {
      load_capture_log_ = absl::StrCat("decode graphs at load: stopped early (", st.message(), ")");
      break;
    }
    RETURN_IF_ERROR(st);
    if (graph_epoch_ == epoch) break;
  }
  // The serving counters (CudaGraphStats) start from here: these steps are the load's.
  captured_at_load_ = graph_captures_;
  load_capture_ms_ = 1e-6 * static_cast<double>(NowNs() - t0);
  graph_captures_ = graph_replays_ = wide_steps_ = 0;
  replay_host_ = {};
  first_steps_ns_ = captures_ns_ = 0;
  return absl::OkStatus();
}

bool CudaBackend::GraphReady(const DecodeGraph& g, const AttentionPlan& plan,
                             int64_t blocks) const {
  if (plan.num_final() != 0 || graph_meta_.size() == 0 || blocks > cap_blocks_ ||
      plan.num_split() > cap_items_ || static_cast<int64_t>(plan.item_rows.size()) > cap_rows_) {
    return false;
  }
  if (!plan.wide_sched.empty() && plan.wide_sched.size() != static_cast<size_t>(wide_ctas_) + 1) {
    return false;
  }
  const size_t partials = std::max(1, plan.num_partials);
  if (partial_o_.size() < partials * 4 * hq_ * d_ || partial_ml_.size() < partials * 8 * hq_ ||
      argmax_.size() < max_graph_batch_ * sizeof(int32_t) ||
      lp_.size() < max_graph_batch_ * sizeof(engine::RowLogprobs)) {
    return false;
  }
  const int form = GraphForm(plan);
  return g.exec[form] != nullptr && g.epoch[form] == graph_epoch_ && g.pinned[form] == nullptr;
}

bool CudaBackend::PrepareSampled(const engine::ForwardBatch& next, std::span<const int32_t> feed) {
  // (Each refusal counted by its reason: CudaGraphStats::speculate_refused.)
  auto refuse = [&](int why) {
    ++speculate_refused_[why];
    return false;
  };
  if (!o_.speculative_launch) return false;
  if (!async_.active || !async_.status.ok()) return refuse(0);
  if (async_.deferred_rows < 0) return refuse(1);
  if (started_.active || copies_pending_) return refuse(2);
  if (!next.penalty_tokens.empty() || feed.size() != next.token_ids.size()) return refuse(3);
  const int n = next.num_tokens();
  if (n == 0 || n > max_graph_batch_ || n != next.num_seqs() ||
      static_cast<int>(next.logits_rows.size()) != n ||
      static_cast<int>(next.row_samples.size()) != n) {
    return refuse(4);
  }
  for (int r = 0; r < n; ++r) {
    if (!next.row_samples[r].on_device || next.row_samples[r].spec.score_token >= 0) {
      return refuse(5);
    }
  }
  for (const int32_t f : feed) {
    if (f >= async_.deferred_rows) return refuse(6);  // (rows of the step in flight only)
  }
  // The batch as it runs; the fed rows' ids are read on the device (0 here, for the check).
  engine::ForwardBatch& b = started_.next;
  b = next;
  for (size_t i = 0; i < feed.size(); ++i) {
    if (feed[i] >= 0) b.token_ids[i] = 0;
  }
  const int bucket = GraphBucket(n);
  const auto it = graphs_.find(bucket);
  if (!Check(b).ok() || it == graphs_.end() || cudaSetDevice(o_.device) != cudaSuccess) {
    return refuse(7);
  }
  // Padded into pad_ for RunDecodeGraph, the step in flight's kept aside (CompleteDeferred reads
  // it), swapped back after.
  std::swap(pad_, started_pad_);
  check_ns_ = 0;
  pad_ns_ = NowNs();
  PadDecodeBatch(b, /*sampled=*/true, bucket);
  AttentionPlan plan;
  absl::Status st = PlanStep(pad_, bucket, &plan);
  const bool ready = st.ok() && GraphReady(*it->second, plan, pad_.block_ids.size());
  const int slot = slot_;
  started_.deferred_rows = -1;
  if (ready) {
    slot_ = 1 - async_.slot;
    feed_ = feed;
    st = RunDecodeGraph(n, bucket, &started_.logits, &started_.tokens, &started_.logprobs,
                        &started_.deferred_rows, &plan);  // (the plan GraphReady checked)
    feed_ = {};
  }
  std::swap(pad_, started_pad_);
  if (!ready || !st.ok() || started_.deferred_rows != n) {
    // (Whatever was enqueued before a failure writes only what this batch's rows would: the
    // next launch restages and reruns them.)
    slot_ = slot;
    return refuse(!ready ? 8 : 9);
  }
  started_.active = true;
  started_.slot = slot_;
  if (async_.eager) ++speculated_after_eager_;
  started_.feed.assign(feed.begin(), feed.end());
  return true;
}

absl::Status CudaBackend::Check(const engine::ForwardBatch& b) const {
  return engine::ValidateForwardBatch(b, {.vocab_size = c_.vocab_size,
                                          .num_blocks = num_blocks_,
                                          .block_size = o_.block_size,
                                          .max_num_tokens = o_.max_num_tokens});
}

absl::Status CudaBackend::EnsureCapacity(DeviceBuffer* buf, size_t bytes, bool graphs_read_it) {
  if (buf->size() >= bytes) return absl::OkStatus();
  RETURN_IF_ERROR(Synchronize(stream_));  // the old buffer may still be in use
  ASSIGN_OR_RETURN(nb, DeviceBuffer::Allocate(std::max(bytes, buf->size() * 2)));
  *buf = std::move(nb);
  if (graphs_read_it) ++graph_epoch_;  // captured graphs hold the old pointer
  return absl::OkStatus();
}

absl::Status CudaBackend::UploadPenalties(const engine::ForwardBatch& b) {
  static_assert(sizeof(float) == sizeof(int32_t));
  for (const auto& [buf, data, n] :
       {std::tuple<DeviceBuffer*, const void*, size_t>{&penalty_, b.penalty_tokens.data(),
                                                       b.penalty_tokens.size()},
        std::tuple<DeviceBuffer*, const void*, size_t>{&penalty_counts_, b.penalty_counts.data(),
                                                       b.penalty_counts.size()},
        std::tuple<DeviceBuffer*, const void*, size_t>{&penalty_bias_, b.penalty_bias.data(),
                                                       b.penalty_bias.size()}}) {
    if (n == 0) continue;
    const size_t bytes = n * sizeof(int32_t);
    RETURN_IF_ERROR(EnsureCapacity(buf, bytes));
    RETURN_IF_ERROR(CopyAsync(buf->data(), data, bytes, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::FetchLogprobs(const engine::ForwardBatch& b, int n,
                                        std::vector<engine::RowLogprobs>* logprobs) {
  if (logprobs == nullptr) return absl::OkStatus();
  logprobs->assign(n, engine::RowLogprobs{});
  bool any = false;
  for (int r = 0; r < n && !b.row_samples.empty(); ++r) {
    any |= b.row_samples[r].on_device && engine::WantsLogprobs(b.row_samples[r].spec);
  }
  if (!any) return absl::OkStatus();
  lp_host_.resize(n);
  RETURN_IF_ERROR(CopyAsync(lp_host_.data(), lp_.data(), n * sizeof(engine::RowLogprobs), stream_));
  RETURN_IF_ERROR(Synchronize(stream_));
  for (int r = 0; r < n; ++r) {
    if (b.row_samples[r].on_device && engine::WantsLogprobs(b.row_samples[r].spec)) {
      (*logprobs)[r] = lp_host_[r];
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Run(const engine::ForwardBatch& b, bool sampled,
                              std::vector<float>* logits, std::vector<int32_t>* argmax,
                              std::vector<engine::RowLogprobs>* logprobs) {
  if (started_.active) {
    // A step PrepareSampled started that no launch adopted (a Forward after the collect): it runs
    // to its end (writing only what its rows would) and is dropped, so its buffers' half is free.
    started_.active = false;
    RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(results_ready_[started_.slot]),
                               "cudaEventSynchronize(started step)"));
    ++speculated_dropped_;
  }
  const int64_t t_check = NowNs();
  RETURN_IF_ERROR(Check(b));
  check_ns_ = NowNs() - t_check;
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(o_.device), "cudaSetDevice"));
  if (copies_pending_) {
    // Blocks copied to the host may be rewritten by this step, and blocks filled from the host
    // are read by it: the step runs after the copies (the host does not wait).
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream_), copies_done_, 0),
                   "cudaStreamWaitEvent"));
    copies_pending_ = false;
  }
  const int n = b.num_tokens();
  // A pure decode step: one token per sequence, logits for each (so logits_rows is 0..n-1), none
  // of them a score row (a prompt token scored: a one-token prefill chunk looks like a decode row,
  // and the graphs' sampling is captured without the score rows' launch).
  bool decode = n > 0 && n == b.num_seqs() && static_cast<int>(b.logits_rows.size()) == n;
  for (size_t r = 0; decode && r < b.row_samples.size(); ++r) {
    decode = b.row_samples[r].spec.score_token < 0;
  }
  if (!decode || n > max_graph_batch_) {
    const bool defer = defer_sync_ && o_.defer_eager_steps && results_ready_[0] != nullptr;
    return RunEager(b, sampled, logits, argmax, logprobs, defer ? &async_.deferred_rows : nullptr);
  }
  const int bucket = GraphBucket(n);
  pad_ns_ = NowNs();
  PadDecodeBatch(b, sampled, bucket);
  auto it = graphs_.find(bucket);
  if (it != graphs_.end() && it->second->Current(graph_epoch_)) {
    return RunDecodeGraph(n, bucket, logits, argmax, logprobs,
                          defer_sync_ ? &async_.deferred_rows : nullptr);
  }
  // First step of this bucket (or after a reallocation): run the padded batch eagerly, which
  // also warms up every kernel and GEMM shape the capture will record, then capture.
  std::vector<int32_t> tokens;
  std::vector<engine::RowLogprobs> lps;
  if (pad_penalty_ != &pad_) {
    pad_.penalty_tokens = pad_penalty_->penalty_tokens;
    pad_.penalty_counts = pad_penalty_->penalty_counts;
    pad_.penalty_bias = pad_penalty_->penalty_bias;
    pad_penalty_ = &pad_;
  }
  RETURN_IF_ERROR(RunEager(pad_, /*sampled=*/true, logits, &tokens, &lps));
  first_steps_ns_ += NowNs() - pad_ns_;
  if (sampled) {
    argmax->assign(tokens.begin(), tokens.begin() + n);
    if (logprobs != nullptr) logprobs->assign(lps.begin(), lps.begin() + n);
  }
  return RunDecodeGraph(n, bucket, nullptr, nullptr, nullptr);  // captures; computes nothing new
}

absl::Status CudaBackend::RunEager(const engine::ForwardBatch& b, bool sampled,
                                   std::vector<float>* logits, std::vector<int32_t>* argmax,
                                   std::vector<engine::RowLogprobs>* logprobs, int* deferred) {
  const int n = b.num_tokens();
  auto on_device = [&](size_t r) {
    return sampled && !b.row_samples.empty() && b.row_samples[r].on_device;
  };
  size_t full_rows = 0;
  for (size_t r = 0; r < b.logits_rows.size(); ++r) full_rows += on_device(r) ? 0 : 1;
  logits->resize(full_rows * c_.vocab_size);
  if (sampled) argmax->assign(b.logits_rows.size(), -1);
  if (logprobs != nullptr) logprobs->assign(b.logits_rows.size(), engine::RowLogprobs{});
  if (n == 0) return absl::OkStatus();

  AttentionPlan plan;
  RETURN_IF_ERROR(PlanStep(b, n, &plan));

  // All int32 metadata in one upload; segments 16-byte aligned.
  meta_host_.clear();
  auto put = [&](const std::vector<int32_t>& v) {
    const size_t at = meta_host_.size();
    meta_host_.insert(meta_host_.end(), v.begin(), v.end());
    meta_host_.resize((meta_host_.size() + 3) / 4 * 4);
    return at;
  };
  const size_t o_tok = put(b.token_ids), o_pos = put(b.positions), o_slot = put(b.slot_mapping);
  const size_t o_blk = put(b.block_ids), o_fi = put(plan.final_items), o_si = put(plan.split_items);
  const size_t o_rows = put(plan.item_rows), o_base = put(plan.partial_base);
  const size_t o_merge = put(plan.merge_list), o_lrows = put(b.logits_rows);
  const size_t o_sched = put(plan.wide_sched);
  RETURN_IF_ERROR(EnsureCapacity(&meta_, meta_host_.size() * 4, /*graphs_read_it=*/false));
  RETURN_IF_ERROR(
      EnsureCapacity(&partial_o_, std::max(1, plan.num_partials) * size_t{4} * hq_ * d_));
  RETURN_IF_ERROR(EnsureCapacity(&partial_ml_, std::max(1, plan.num_partials) * size_t{8} * hq_));
  RETURN_IF_ERROR(CopyAsync(meta_.data(), meta_host_.data(), meta_host_.size() * 4, stream_));
  const int32_t* meta = meta_.as<int32_t>();

  StepMeta m;
  m.tokens = meta + o_tok;
  m.positions = meta + o_pos;
  m.slots = meta + o_slot;
  m.block_ids = meta + o_blk;
  m.logits_rows = meta + o_lrows;
  m.plan = AttentionPlanView{
      meta + o_fi,   plan.num_final(), meta + o_si,      plan.num_split(),    meta + o_rows,
      meta + o_base, meta + o_merge,   plan.num_merge(), plan.max_final_rows, plan.max_split_rows};
  m.plan.split_form = SplitForm(plan, d_, hq_ / hkv_);
  m.plan.ws_work = ws_work_.as<int32_t>();
  m.plan.super_tiles = plan.super_tiles;
  m.plan.num_wide = plan.num_wide;
  if (!plan.wide_sched.empty()) {
    m.plan.wide_sched = meta + o_sched;
    m.plan.wide_ctas = static_cast<int>(plan.wide_sched.size()) - 1;
  }
  if (plan.num_wide > 0) ++wide_steps_;
  RETURN_IF_ERROR(EnqueueModel(n, m));

  const int rows = static_cast<int>(b.logits_rows.size());
  const int64_t vocab = c_.vocab_size;
  if (sampled) {
    RETURN_IF_ERROR(EnsureCapacity(&argmax_, std::max(rows, 1) * sizeof(int32_t)));
    sample_host_.assign(rows, RowSampleParams{});
    for (int r = 0; r < rows && !b.row_samples.empty(); ++r) {
      sample_host_[r] = b.row_samples[r].spec;
      m.score_rows |= b.row_samples[r].on_device && sample_host_[r].score_token >= 0;
    }
    RETURN_IF_ERROR(EnsureCapacity(&sample_params_, std::max(rows, 1) * sizeof(RowSampleParams),
                                   /*graphs_read_it=*/false));
    RETURN_IF_ERROR(EnsureCapacity(&lp_, std::max(rows, 1) * sizeof(engine::RowLogprobs)));
    RETURN_IF_ERROR(CopyAsync(sample_params_.data(), sample_host_.data(),
                              rows * sizeof(RowSampleParams), stream_));
    RETURN_IF_ERROR(UploadPenalties(b));
    // Rows are drawn on the device (RowSample); the per-row parameters ride in the same stream
    // as the rest of the step's metadata.
    m.samples = sample_params_.as<RowSampleParams>();
    m.penalty = penalty_.as<int32_t>();
    m.counts = penalty_counts_.as<int32_t>();
    m.bias = penalty_bias_.as<float>();
  }
  size_t full_done = 0;
  for (int r0 = 0; r0 < rows; r0 += o_.max_logits_rows) {
    const int mrows = std::min(o_.max_logits_rows, rows - r0);
    RETURN_IF_ERROR(EnqueueHead(r0, mrows, m));
    // Whole rows only where the caller samples on the host; runs of them copy in one go.
    const size_t full_before = full_done;
    for (int i = 0; i < mrows;) {
      if (on_device(r0 + i)) {
        ++i;
        continue;
      }
      int j = i;
      while (j < mrows && !on_device(r0 + j)) ++j;
      RETURN_IF_ERROR(CopyAsync(logits->data() + full_done * vocab,
                                logits_.as<float>() + static_cast<int64_t>(i) * vocab,
                                (j - i) * vocab * 4, stream_));
      full_done += j - i;
      i = j;
    }
    // logits_ is reused by the next chunk of rows: its copies to the host must be done first
    // (the device's own reads of it, the sampling kernels, are ordered on the stream).
    if (full_done != full_before && r0 + mrows < rows) RETURN_IF_ERROR(Synchronize(stream_));
  }
  if (deferred != nullptr && sampled && full_rows == 0 && !m.score_rows) {
    RETURN_IF_ERROR(DeferResults(b.row_samples, rows, /*ids_copied=*/false));
    *deferred = rows;
    async_.eager = true;
    ++eager_deferred_;
    return absl::OkStatus();
  }
  if (sampled && rows > 0) {
    argmax_host_.resize(rows);
    RETURN_IF_ERROR(
        CopyAsync(argmax_host_.data(), argmax_.data(), rows * sizeof(int32_t), stream_));
    RETURN_IF_ERROR(Synchronize(stream_));
    for (int r = 0; r < rows; ++r) {
      if (on_device(r)) (*argmax)[r] = argmax_host_[r];
    }
    RETURN_IF_ERROR(FetchLogprobs(b, rows, logprobs));
  }
  return Synchronize(stream_);
}

absl::Status CudaBackend::EnqueueModel(int n, const StepMeta& m) {
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const Bf16* x = x_.as<Bf16>();
  Bf16* xm = x_.as<Bf16>();
  float* res = residual_.as<float>();
  RETURN_IF_ERROR(EmbeddingGather(embed_.as<Bf16>(), m.tokens, n, hidden_, res, stream_));
  // The delta not yet added to the residual (none, or o_proj's / down_proj's output in delta_:
  // bf16, or `splits` f32 partials whose sum the norm takes), added by the next norm.
  int pending = 0;
  // o_proj and down_proj into delta_, as bf16 or as split-K partials.
  auto narrow = [&](const Bf16* in, const Bf16* w, int k, int splits) -> absl::Status {
    pending = splits;
    if (splits == 1) {
      return gemm_->Run(in, w, n, hidden_, k, delta_.data(), GemmOut::kBf16, stream_);
    }
    return gemm_->RunPartials(in, w, n, hidden_, k, delta_.as<float>(), stream_);
  };
  auto add_norm = [&](const DeviceBuffer& weight) -> absl::Status {
    if (pending > 1) {
      return AddRmsNormSplit(res, delta_.as<float>(), pending, weight.as<Bf16>(), eps, n, hidden_,
                             xm, stream_);
    }
    return AddRmsNorm(res, pending == 1 ? delta_.as<Bf16>() : nullptr, weight.as<Bf16>(), eps, n,
                      hidden_, xm, stream_);
  };
  // Weights hinted into L2 on the side stream once stream_ has reached this point (a fork: the
  // prefetch kernel waits for the work enqueued so far, nothing waits for it until the join).
  // Decode graphs only: where it was measured, and an eager step would pay two host calls a fork.
  const bool prefetch =
      prefetch_stream_ != nullptr && n <= prefetch_max_rows_ && IsCapturing(stream_);
  bool forked = false;
  auto prefetch_l2 = [&](std::initializer_list<const DeviceBuffer*> weights) -> absl::Status {
    if (!prefetch) return absl::OkStatus();
    L2Regions r;
    for (const DeviceBuffer* w : weights) {
      r.data[r.count] = w->data();
      r.bytes[r.count++] = w->size() / 16 * 16;
    }
    const auto main = reinterpret_cast<cudaStream_t>(stream_);
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(prefetch_fork_, main), "cudaEventRecord"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(prefetch_stream_, prefetch_fork_, 0),
                               "cudaStreamWaitEvent"));
    forked = true;
    return PrefetchL2(r, o_.prefetch_weights_ctas, reinterpret_cast<Stream>(prefetch_stream_));
  };
  if (!layers_.empty()) RETURN_IF_ERROR(prefetch_l2({&layers_[0].wqkv}));
  for (size_t li = 0; li < layers_.size(); ++li) {
    Layer& l = layers_[li];
    RETURN_IF_ERROR(add_norm(l.input_norm));
    RETURN_IF_ERROR(gemm_->Run(x, l.wqkv.as<Bf16>(), n, qkv_cols_, hidden_, qkv_.data(),
                               GemmOut::kBf16, stream_));
    KvCacheView cache{
        l.k_cache.as<Bf16>(), l.v_cache.as<Bf16>(), num_blocks_, o_.block_size, hkv_, d_};
    // q/k norm + RoPE + paged KV append in one pass (bitwise the two separate ops).
    RETURN_IF_ERROR(QkNormRopeAppend(qkv_.as<Bf16>(), n, qkv_cols_, HeadShape{hq_, hkv_, d_},
                                     m.positions, c_.qk_norm() ? l.q_norm.as<Bf16>() : nullptr,
                                     c_.qk_norm() ? l.k_norm.as<Bf16>() : nullptr, eps,
                                     inv_freq_.as<float>(), m.slots, cache, stream_));
    if (o_.prefetch_weights_early) RETURN_IF_ERROR(prefetch_l2({&l.wo, &l.wgu, &l.wd}));
    AttentionArgs args{qkv_.as<Bf16>(),
                       qkv_cols_,
                       cache,
                       m.positions,
                       m.block_ids,
                       attn_.as<Bf16>(),
                       partial_o_.as<float>(),
                       partial_ml_.as<float>(),
                       1.f / std::sqrt(static_cast<float>(d_)),
                       hq_};
    RETURN_IF_ERROR(Attention(args, m.plan, stream_));
    if (!o_.prefetch_weights_early) RETURN_IF_ERROR(prefetch_l2({&l.wo, &l.wgu, &l.wd}));
    RETURN_IF_ERROR(narrow(attn_.as<Bf16>(), l.wo.as<Bf16>(), hq_ * d_, o_splits_));
    RETURN_IF_ERROR(add_norm(l.post_norm));
    if (li + 1 < layers_.size()) RETURN_IF_ERROR(prefetch_l2({&layers_[li + 1].wqkv}));
    int cols = 0, stages = 0;
    if (o_.fuse_silu &&
        gemm_->DecodeGemmFor(n, 2 * inter_, hidden_, GemmOut::kBf16, &cols, &stages) &&
        cols >= 16) {
      // The kernel Run would use, with SiluMul in its epilogue: the same bits in act_, one launch.
      RETURN_IF_ERROR(DecodeGemmSiluMul(x, l.wgu.as<Bf16>(), n, 2 * inter_, hidden_,
                                        act_.as<Bf16>(), stream_, cols, stages));
    } else {
      RETURN_IF_ERROR(gemm_->Run(x, l.wgu.as<Bf16>(), n, 2 * inter_, hidden_, gu_.data(),
                                 GemmOut::kBf16, stream_));
      RETURN_IF_ERROR(SiluMul(gu_.as<Bf16>(), n, inter_, act_.as<Bf16>(), stream_));
    }
    RETURN_IF_ERROR(narrow(act_.as<Bf16>(), l.wd.as<Bf16>(), inter_, down_splits_));
  }
  if (forked) {  // join: a captured graph must end on one stream, eager work stays ordered
    RETURN_IF_ERROR(
        CudaStatus(cudaEventRecord(prefetch_join_, prefetch_stream_), "cudaEventRecord"));
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream_), prefetch_join_, 0),
                   "cudaStreamWaitEvent"));
  }
  return add_norm(final_norm_);
}

absl::Status CudaBackend::EnqueueHead(int r0, int rows, const StepMeta& m) {
  RETURN_IF_ERROR(
      GatherRows(x_.as<Bf16>(), m.logits_rows + r0, rows, hidden_, xl_.as<Bf16>(), stream_));
  const int vocab = static_cast<int>(c_.vocab_size);
  RETURN_IF_ERROR(gemm_->Run(xl_.as<Bf16>(), lm_head_, rows, vocab, hidden_, logits_.data(),
                             GemmOut::kF32, stream_));
  if (m.samples == nullptr) return absl::OkStatus();
  return SampleRows(logits_.as<float>(), rows, vocab, m.samples + r0, m.penalty, m.counts, m.bias,
                    argmax_.as<int32_t>() + r0, lp_.as<engine::RowLogprobs>() + r0, stream_,
                    m.score_rows);
}

// ---- Decode graphs ----------------------------------------------------------------------------
//
// A pure decode step of n rows runs as a graph captured for bucket B >= n: the batch is padded
// with B - n inert rows (token 0 at position 0, reading block 0, writing no KV: slot -1, sampled
// greedily and ignored). Rows never mix (batch invariance), so the real rows compute exactly what
// the eager step computes: the same GEMM algorithms (pinned per shape, not per m), the same
// attention items and fold order (the split kernel reads the step's item count on the device and
// loops a fixed grid over the items), the same sampling kernel. Every pointer a graph holds is
// fixed: metadata lives at fixed offsets of graph_meta_, copied from pinned staging before each
// replay; a reallocation of any buffer bumps graph_epoch_ and the bucket is captured again.

size_t RoundUp4(size_t x) { return (x + 3) / 4 * 4; }

// Offsets (int32 units) of the segments of graph_meta_.
struct GraphLayout {
  size_t tok, pos, slot, lrows, base, merge, count, samples, feed, blk, items, wide, rows, sched,
      end;
};

// wide_ctas: the wide kernel's CTAs (its schedule has wide_ctas + 1 entries).
GraphLayout MakeGraphLayout(int max_batch, int64_t cap_blocks, int64_t cap_items, int64_t cap_rows,
                            int wide_ctas) {
  const size_t b = RoundUp4(max_batch);
  GraphLayout l;
  l.tok = 0;
  l.pos = b;
  l.slot = 2 * b;
  l.lrows = 3 * b;
  l.base = 4 * b;
  l.merge = 5 * b;  // 3 per row
  l.count = 8 * b;  // [0]: split items (after the wide ones), [1]: wide cascade items
  l.samples = l.count + 4;
  static_assert(sizeof(RowSampleParams) % 8 == 0, "RowSampleParams packs into 8-byte units");
  l.feed = l.samples + RoundUp4(b * sizeof(RowSampleParams) / 4);  // a started step's feed
  l.blk = l.feed + b;
  l.items = l.blk + RoundUp4(cap_blocks);
  l.wide = l.items + RoundUp4(cap_items * kItemFields);
  l.rows = l.wide + RoundUp4(cap_items * kItemFields);
  l.sched = l.rows + RoundUp4(cap_rows);
  l.end = l.sched + RoundUp4(static_cast<size_t>(wide_ctas) + 1);
  return l;
}

int CudaBackend::GraphBucket(int n) const {
  int b;
  if (n <= 4) {
    b = n <= 1 ? 1 : n <= 2 ? 2 : 4;
  } else if (n <= 64) {
    b = (n + 7) / 8 * 8;
  } else if (n <= 128) {
    b = (n + 15) / 16 * 16;
  } else {
    b = (n + 31) / 32 * 32;
  }
  return std::min(b, max_graph_batch_);
}

void CudaBackend::PadDecodeBatch(const engine::ForwardBatch& b, bool sampled, int bucket) {
  const int n = b.num_tokens();
  pad_.token_ids = b.token_ids;
  pad_.positions = b.positions;
  pad_.slot_mapping = b.slot_mapping;
  pad_.query_start = b.query_start;
  pad_.context_lens = b.context_lens;
  pad_.block_table_start = b.block_table_start;
  pad_.block_ids = b.block_ids;
  pad_.logits_rows = b.logits_rows;
  pad_.row_samples.assign(n, engine::RowSample{});  // on_device false: the whole row comes back
  pad_.penalty_tokens.clear();  // (not copied: tens of thousands at large batches)
  pad_.penalty_counts.clear();
  pad_.penalty_bias.clear();
  pad_penalty_ = &pad_;
  if (sampled && !b.row_samples.empty()) {
    pad_.row_samples = b.row_samples;
    pad_penalty_ = &b;
  }
  for (int i = n; i < bucket; ++i) {
    pad_.token_ids.push_back(0);
    pad_.positions.push_back(0);
    pad_.slot_mapping.push_back(-1);
    pad_.query_start.push_back(i + 1);
    pad_.context_lens.push_back(1);
    pad_.block_ids.push_back(0);
    pad_.block_table_start.push_back(static_cast<int32_t>(pad_.block_ids.size()));
    pad_.logits_rows.push_back(i);
    pad_.row_samples.push_back(engine::RowSample{true, {}});  // greedy
  }
}

absl::Status CudaBackend::PlanStep(const engine::ForwardBatch& b, int n,
                                   AttentionPlan* plan) const {
  AttentionConfig acfg{hq_, hkv_, d_, o_.block_size, o_.cascade};
  if (o_.attention_single_level) acfg.grouping = CascadeGrouping::kLeadingTiles;
  acfg.lead_tiles = o_.attention_lead_tiles;
  acfg.finish_rows = o_.attention_finish_rows;
  acfg.split_ctas = split_ctas_;
  acfg.ws_ctas = ws_ctas_;
  acfg.wide_ctas = wide_ctas_;
  acfg.super_tiles = super_tiles_;
  acfg.wide_rows = wide_rows_;
  const AttentionBatch ab{b.positions.data(),
                          n,
                          b.query_start.data(),
                          b.context_lens.data(),
                          b.block_table_start.data(),
                          b.block_ids.data(),
                          b.num_seqs()};
  return PlanAttention(acfg, ab, plan);
}

absl::Status CudaBackend::RunDecodeGraph(int n, int bucket, std::vector<float>* logits,
                                         std::vector<int32_t>* argmax,
                                         std::vector<engine::RowLogprobs>* logprobs, int* deferred,
                                         AttentionPlan* planned) {
  const engine::ForwardBatch& b = pad_;
  AttentionPlan plan;
  if (planned != nullptr) {
    plan = std::move(*planned);
  } else {
    RETURN_IF_ERROR(PlanStep(b, bucket, &plan));
  }
  const int64_t t_planned = NowNs();
  if (plan.num_final() != 0 || plan.num_merge() != bucket) {
    return absl::InternalError("cuda backend: a decode step planned prefill items");
  }

  // Capacities (grown with slack; growing re-captures every bucket).
  const int64_t need_blocks = static_cast<int64_t>(b.block_ids.size());
  const int64_t need_items = plan.num_split(), need_rows = plan.item_rows.size();
  if (need_blocks > cap_blocks_ || need_items > cap_items_ || need_rows > cap_rows_ ||
      graph_meta_.size() == 0) {
    cap_blocks_ = std::max(cap_blocks_, 2 * need_blocks);
    cap_items_ = std::max(cap_items_, 2 * need_items);
    cap_rows_ = std::max(cap_rows_, 2 * need_rows);
    const size_t bytes =
        MakeGraphLayout(max_graph_batch_, cap_blocks_, cap_items_, cap_rows_, wide_ctas_).end * 4;
    RETURN_IF_ERROR(Synchronize(stream_));
    ASSIGN_OR_RETURN(meta, DeviceBuffer::Allocate(bytes));
    graph_meta_ = std::move(meta);
    for (PinnedBuffer& half : graph_host_) RETURN_IF_ERROR(half.Resize(bytes));
    ++graph_epoch_;
  }
  auto ensure = [&](DeviceBuffer* buf, size_t bytes) {
    return buf->size() >= bytes ? absl::OkStatus() : EnsureCapacity(buf, 2 * bytes);
  };
  const size_t partials = std::max(1, plan.num_partials);
  RETURN_IF_ERROR(ensure(&partial_o_, partials * 4 * hq_ * d_));
  RETURN_IF_ERROR(ensure(&partial_ml_, partials * 8 * hq_));
  RETURN_IF_ERROR(ensure(&argmax_, max_graph_batch_ * sizeof(int32_t)));
  RETURN_IF_ERROR(ensure(&lp_, max_graph_batch_ * sizeof(engine::RowLogprobs)));
  RETURN_IF_ERROR(ensure(&penalty_, pad_penalty_->penalty_tokens.size() * sizeof(int32_t)));
  RETURN_IF_ERROR(ensure(&penalty_counts_, pad_penalty_->penalty_counts.size() * sizeof(int32_t)));
  RETURN_IF_ERROR(ensure(&penalty_bias_, pad_penalty_->penalty_bias.size() * sizeof(float)));

  // Stage this step's metadata at the fixed offsets.
  const GraphLayout l =
      MakeGraphLayout(max_graph_batch_, cap_blocks_, cap_items_, cap_rows_, wide_ctas_);
  int32_t* h = graph_host_[slot_].as<int32_t>();
  auto put = [&](size_t at, const std::vector<int32_t>& v) {
    std::memcpy(h + at, v.data(), v.size() * 4);
  };
  put(l.tok, b.token_ids);
  put(l.pos, b.positions);
  put(l.slot, b.slot_mapping);
  put(l.lrows, b.logits_rows);
  put(l.base, plan.partial_base);
  put(l.merge, plan.merge_list);
  h[l.count] = plan.num_split() - plan.num_wide;
  h[l.count + 1] = plan.num_wide;
  auto* params = reinterpret_cast<RowSampleParams*>(h + l.samples);
  for (int r = 0; r < bucket; ++r) {
    params[r] = b.row_samples[r].spec;
  }
  put(l.blk, b.block_ids);
  // Wide items (the plan's first num_wide) apart from the split kernel's.
  const size_t wide_fields = static_cast<size_t>(plan.num_wide) * kItemFields;
  std::memcpy(h + l.wide, plan.split_items.data(), wide_fields * 4);
  std::memcpy(h + l.items, plan.split_items.data() + wide_fields,
              (plan.split_items.size() - wide_fields) * 4);
  put(l.rows, plan.item_rows);
  // The wide schedule's CTAs are the captured grid: every step's plan has wide_ctas_ + 1 entries
  // (none where wide_ctas_ is 0: the kernel's own snake then), checked before the copy into its
  // segment, the layout's last.
  if (!plan.wide_sched.empty() && plan.wide_sched.size() != static_cast<size_t>(wide_ctas_) + 1) {
    return absl::InternalError(absl::StrCat("cuda backend: a wide schedule of ",
                                            plan.wide_sched.size(), " entries for ", wide_ctas_,
                                            " CTAs"));
  }
  put(l.sched, plan.wide_sched);
  if (!feed_.empty()) {  // a started step's fed inputs (PrepareSampled); padding rows none
    std::memcpy(h + l.feed, feed_.data(), feed_.size() * 4);
    std::fill(h + l.feed + feed_.size(), h + l.feed + bucket, -1);
  }

  const int32_t* meta = graph_meta_.as<int32_t>();
  const int group = hq_ / hkv_;
  StepMeta m;
  m.tokens = meta + l.tok;
  m.positions = meta + l.pos;
  m.slots = meta + l.slot;
  m.block_ids = meta + l.blk;
  m.logits_rows = meta + l.lrows;
  m.samples = reinterpret_cast<const RowSampleParams*>(meta + l.samples);
  m.penalty = penalty_.as<int32_t>();
  m.counts = penalty_counts_.as<int32_t>();
  m.bias = penalty_bias_.as<float>();
  m.plan = AttentionPlanView{nullptr,
                             0,
                             meta + l.items,
                             split_ctas_,
                             meta + l.rows,
                             meta + l.base,
                             meta + l.merge,
                             bucket,
                             0,
                             std::max(1, kMaxQueriesPerCta / group),
                             meta + l.count};
  const int split_form = SplitForm(plan, d_, hq_ / hkv_);
  m.plan.split_form = split_form;
  m.plan.ws_work = ws_work_.as<int32_t>();
  m.plan.super_tiles = plan.super_tiles;
  if (split_form == 1) m.plan.num_split = split_ctas_reg_;
  const int form = GraphForm(plan);
  if (plan.num_wide > 0) {
    m.plan.num_wide = 1;
    m.plan.wide_items = meta + l.wide;
    m.plan.wide_count = meta + l.count + 1;
    if (!plan.wide_sched.empty()) {
      m.plan.wide_sched = meta + l.sched;
      m.plan.wide_ctas = wide_ctas_;
    }
  }

  std::unique_ptr<DecodeGraph>& g = graphs_[bucket];
  if (g == nullptr || g->exec[form] == nullptr || g->epoch[form] != graph_epoch_) {
    if (g == nullptr) g = std::make_unique<DecodeGraph>();
    RETURN_IF_ERROR(CaptureDecodeGraph(bucket, form, m, g.get()));
  }
  // Capture only (the step ran eagerly), unless tuned and pinned graphs are to be timed.
  if (logits == nullptr && g->pinned[form] == nullptr) return absl::OkStatus();

  const auto s = reinterpret_cast<cudaStream_t>(stream_);
  const int64_t t_staged = NowNs();
  // The used parts of the variable segments only.
  int32_t* dm = graph_meta_.as<int32_t>();
  RETURN_IF_ERROR(CopyAsync(dm, h, (l.blk + b.block_ids.size()) * 4, stream_));
  RETURN_IF_ERROR(
      CopyAsync(dm + l.items, h + l.items, (plan.split_items.size() - wide_fields) * 4, stream_));
  if (wide_fields > 0) {
    RETURN_IF_ERROR(CopyAsync(dm + l.wide, h + l.wide, wide_fields * 4, stream_));
  }
  RETURN_IF_ERROR(CopyAsync(dm + l.rows, h + l.rows, plan.item_rows.size() * 4, stream_));
  if (!plan.wide_sched.empty()) {
    RETURN_IF_ERROR(CopyAsync(dm + l.sched, h + l.sched, plan.wide_sched.size() * 4, stream_));
  }
  if (!feed_.empty()) {  // the step before this one wrote its ids to argmax_ (and copied them out)
    RETURN_IF_ERROR(FeedTokens(dm + l.tok, dm + l.feed, argmax_.as<int32_t>(), bucket, stream_));
  }
  RETURN_IF_ERROR(UploadPenalties(*pad_penalty_));  // capacity ensured above: no reallocation
  if (g->pinned[form] != nullptr) RETURN_IF_ERROR(PickTunedOrPinned(g.get(), form));
  if (logits == nullptr) return Synchronize(stream_);
  if (plan.num_wide > 0) ++wide_steps_;
  const int64_t t_uploaded = NowNs();
  RETURN_IF_ERROR(CudaStatus(cudaGraphLaunch(g->exec[form], s), "cudaGraphLaunch"));
  ++graph_replays_;
  const int64_t t_launched = NowNs();
  replay_host_.check_ns += check_ns_;
  replay_host_.plan_ns += t_planned - pad_ns_;
  replay_host_.stage_ns += t_staged - t_planned;
  replay_host_.upload_ns += t_uploaded - t_staged;
  replay_host_.launch_ns += t_launched - t_uploaded;
  // The results' copies (and the wait, where the step is not left in flight), on every return.
  const ElapsedNsTo add_results{&replay_host_.results_ns, t_launched};
  const int32_t* tokens = graph_tokens_host_[slot_].as<int32_t>();
  RETURN_IF_ERROR(
      CopyAsync(graph_tokens_host_[slot_].as<int32_t>(), argmax_.data(), n * 4, stream_));
  // Whole rows for the rows not sampled on the device, runs of them in one copy.
  const int64_t vocab = c_.vocab_size;
  size_t full = 0;
  for (int r = 0; r < n; ++r) full += b.row_samples[r].on_device ? 0 : 1;
  logits->resize(full * vocab);
  size_t done = 0;
  for (int i = 0; i < n;) {
    if (b.row_samples[i].on_device) {
      ++i;
      continue;
    }
    int j = i;
    while (j < n && !b.row_samples[j].on_device) ++j;
    RETURN_IF_ERROR(CopyAsync(logits->data() + done * vocab, logits_.as<float>() + i * vocab,
                              (j - i) * vocab * 4, stream_));
    done += j - i;
    i = j;
  }
  if (deferred != nullptr && full == 0 && argmax != nullptr) {
    RETURN_IF_ERROR(DeferResults(b.row_samples, n, /*ids_copied=*/true));
    *deferred = n;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Synchronize(stream_));
  if (argmax != nullptr) {
    argmax->assign(n, -1);
    for (int r = 0; r < n; ++r) {
      if (b.row_samples[r].on_device) (*argmax)[r] = tokens[r];
    }
  }
  return FetchLogprobs(b, n, logprobs);
}

absl::Status CudaBackend::CompleteDeferred(int n, int slot, std::vector<int32_t>* tokens,
                                           std::vector<engine::RowLogprobs>* logprobs) {
  // The step's own copies, not the stream: a started step may be queued behind it.
  RETURN_IF_ERROR(
      CudaStatus(cudaEventSynchronize(results_ready_[slot]), "cudaEventSynchronize(results)"));
  const int32_t* t = graph_tokens_host_[slot].as<int32_t>();
  tokens->assign(t, t + n);
  logprobs->assign(n, engine::RowLogprobs{});
  const auto* lp = reinterpret_cast<const engine::RowLogprobs*>(lp_pinned_[slot].as<int32_t>());
  const std::vector<uint8_t>& wants = deferred_lp_[slot];
  for (int r = 0; r < n && r < static_cast<int>(wants.size()); ++r) {
    if (wants[r] != 0) (*logprobs)[r] = lp[r];
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::DeferResults(const std::vector<engine::RowSample>& samples, int n,
                                       bool ids_copied) {
  const auto s = reinterpret_cast<cudaStream_t>(stream_);
  if (!ids_copied && n > 0) {
    // This half's last step was collected; a step past the graphs' rows (an eager one) grows it.
    PinnedBuffer& ids = graph_tokens_host_[slot_];
    if (ids.size() < n * sizeof(int32_t)) RETURN_IF_ERROR(ids.Resize(n * sizeof(int32_t)));
    RETURN_IF_ERROR(CopyAsync(ids.as<int32_t>(), argmax_.data(), n * sizeof(int32_t), stream_));
  }
  std::vector<uint8_t>& wants = deferred_lp_[slot_];
  wants.assign(n, 0);
  bool any_lp = false;
  for (int r = 0; r < n; ++r) {
    wants[r] = engine::WantsLogprobs(samples[r].spec) ? 1 : 0;
    any_lp |= wants[r] != 0;
  }
  if (any_lp) {
    PinnedBuffer& lp = lp_pinned_[slot_];
    const size_t bytes = std::max<size_t>(max_graph_batch_, n) * sizeof(engine::RowLogprobs);
    if (lp.size() < bytes) RETURN_IF_ERROR(lp.Resize(bytes));
    RETURN_IF_ERROR(
        CopyAsync(lp.as<int32_t>(), lp_.data(), n * sizeof(engine::RowLogprobs), stream_));
  }
  return CudaStatus(cudaEventRecord(results_ready_[slot_], s), "cudaEventRecord");
}

absl::Status CudaBackend::CaptureDecodeGraph(int bucket, int form, const StepMeta& m,
                                             DecodeGraph* g) {
  const auto s = reinterpret_cast<cudaStream_t>(stream_);
  const ElapsedNsTo add_time{&captures_ns_};
  auto capture = [&](cudaGraphExec_t* exec) {
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture"));
    absl::Status st = EnqueueModel(bucket, m);
    if (st.ok()) st = EnqueueHead(0, bucket, m);
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(s, &graph);
    if (!st.ok() || end != cudaSuccess) {  // whatever graph the capture returned is freed
      if (graph != nullptr) cudaGraphDestroy(graph);
      return st.ok() ? CudaStatus(end, "cudaStreamEndCapture") : st;
    }
    const cudaError_t inst = cudaGraphInstantiate(exec, graph, 0);
    cudaGraphDestroy(graph);
    return CudaStatus(inst, "cudaGraphInstantiate");
  };
  cudaGraphExec_t exec = nullptr, pinned = nullptr;
  RETURN_IF_ERROR(capture(&exec));
  if (gemm_->Replaced(bucket)) {  // the pinned algorithms' step too, timed against it at replay
    gemm_->set_use_tuned(false);
    const absl::Status st = capture(&pinned);
    gemm_->set_use_tuned(true);
    if (!st.ok()) {
      cudaGraphExecDestroy(exec);
      return st;
    }
  }
  if (g->exec[form] != nullptr) cudaGraphExecDestroy(g->exec[form]);
  if (g->pinned[form] != nullptr) cudaGraphExecDestroy(g->pinned[form]);
  g->exec[form] = exec;
  g->pinned[form] = pinned;
  g->epoch[form] = graph_epoch_;
  ++graph_captures_;
  return absl::OkStatus();
}

absl::Status CudaBackend::PickTunedOrPinned(DecodeGraph* g, int form) {
  const auto s = reinterpret_cast<cudaStream_t>(stream_);
  cudaEvent_t ev[3] = {nullptr, nullptr, nullptr};
  for (cudaEvent_t& e : ev) RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&e), "cudaEventCreate"));
  // Replays recompute this step from the same inputs: the same bits into the same buffers (the
  // KV slots get the values they already hold). Alternating rounds, the first one a warm-up.
  float tuned_ms = 0, pinned_ms = 0;
  absl::Status st;
  for (int round = 0; round < 4 && st.ok(); ++round) {
    float a = 0, b = 0;
    st = CudaStatus(cudaEventRecord(ev[0], s), "cudaEventRecord");
    if (st.ok()) st = CudaStatus(cudaGraphLaunch(g->exec[form], s), "cudaGraphLaunch");
    if (st.ok()) st = CudaStatus(cudaEventRecord(ev[1], s), "cudaEventRecord");
    if (st.ok()) st = CudaStatus(cudaGraphLaunch(g->pinned[form], s), "cudaGraphLaunch");
    if (st.ok()) st = CudaStatus(cudaEventRecord(ev[2], s), "cudaEventRecord");
    if (st.ok()) st = CudaStatus(cudaEventSynchronize(ev[2]), "cudaEventSynchronize");
    if (st.ok()) st = CudaStatus(cudaEventElapsedTime(&a, ev[0], ev[1]), "cudaEventElapsedTime");
    if (st.ok()) st = CudaStatus(cudaEventElapsedTime(&b, ev[1], ev[2]), "cudaEventElapsedTime");
    if (round > 0) {
      tuned_ms += a;
      pinned_ms += b;
    }
  }
  for (cudaEvent_t e : ev) cudaEventDestroy(e);
  RETURN_IF_ERROR(st);
  if (pinned_ms < tuned_ms) {
    std::swap(g->exec[form], g->pinned[form]);
    ++tuned_dropped_;
  } else {
    ++tuned_kept_;
  }
  cudaGraphExecDestroy(g->pinned[form]);
  g->pinned[form] = nullptr;
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateCudaBackendOptions(const CudaBackendOptions& o) {
  if (o.block_size <= 0 || kTileTokens % o.block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: block_size ", o.block_size, " must divide ", kTileTokens));
  }
  if (o.num_blocks < 0 || o.max_num_tokens <= 0 || o.max_logits_rows <= 0 ||
      o.max_graph_batch < 0 || !(o.kv_cache_fraction > 0 && o.kv_cache_fraction < 1) ||
      o.device < 0 || o.split_k < 0 || o.split_columns < 8 || o.gemm_reference_m <= 0 ||
      o.decode_gemm_early_chunks < 0 || o.gemm_tune_min_hidden < 0 || o.gemm_prefill_min_m < 0 ||
      o.prefetch_weights_max_rows < 0 || o.prefetch_weights_ctas < 1 ||
      o.prefetch_weights_ctas > 1024) {
    return absl::InvalidArgumentError("cuda backend: bad options");
  }
  if (o.split_residual_min < 1 || o.split_residual_min > 64 ||
      (o.split_residual_min & (o.split_residual_min - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cuda backend: split_residual_min ",
                                                   o.split_residual_min,
                                                   " must be a power of two in [1, 64]"));
  }
  if (o.attention_super_tiles != 0 && o.attention_super_tiles != 1 &&
      o.attention_super_tiles != kSuperTiles) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: attention_super_tiles ", o.attention_super_tiles,
                     " is not a fold order the kernels run; use 1 (one level), ", kSuperTiles,
                     " (super-tiles) or 0 (super-tiles where the device runs them)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<engine::Backend>> NewCudaBackend(const model::Model& model,
                                                                const CudaBackendOptions& options) {
  RETURN_IF_ERROR(ValidateCudaBackendOptions(options));
  if (DeviceCount() == 0) return absl::UnavailableError("cuda backend: no CUDA device");
  auto b = std::make_unique<CudaBackend>(model.config(), options);
  RETURN_IF_ERROR(b->Init(model));
  return std::unique_ptr<engine::Backend>(std::move(b));
}

CudaGraphStats GetCudaGraphStats(const engine::Backend& backend) {
  const auto* b = dynamic_cast<const CudaBackend*>(&backend);
  return b != nullptr ? b->graph_stats() : CudaGraphStats{};
}

}  // namespace cascade::cuda
