// Engine implementation: a request inbox guarded by a mutex, and step state owned by the step
// thread (sequences, block manager, scheduler). Step = intake, schedule, run (backend),
// postprocess.
#include "gpu_worker/engine/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <random>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "gpu_worker/engine/block_manager.h"
#include "gpu_worker/engine/host_tier.h"
#include "gpu_worker/engine/peer_blocks.h"
#include "gpu_worker/engine/penalty_list.h"
#include "gpu_worker/engine/residency.h"
#include "gpu_worker/engine/sampler.h"
#include "gpu_worker/engine/scheduler.h"

namespace cascade::engine {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

namespace {

int64_t SteadyNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The host tier options.host_kv_bytes asks for, or null (with why in *status when it failed).
std::unique_ptr<HostKvTier> MakeHostTier(const EngineOptions& options, Backend& backend,
                                         absl::Status* status) {
  const int64_t block_bytes = backend.KvBlockBytes();
  if (options.host_kv_bytes <= 0 || block_bytes <= 0) return nullptr;
  const int64_t slots = options.host_kv_bytes / block_bytes;
  if (slots < 1) {
    *status = absl::InvalidArgumentError(absl::StrCat("host_kv_bytes ", options.host_kv_bytes,
                                                      " is less than one KV block (", block_bytes,
                                                      " bytes)"));
    return nullptr;
  }
  absl::StatusOr<HostKvMemory> mem = backend.AllocateHostKv(slots * block_bytes);
  if (!mem.ok()) {
    *status = mem.status();
    return nullptr;
  }
  return std::make_unique<HostKvTier>(slots, block_bytes, *std::move(mem), options.now_ms);
}

class EngineImpl final : public Engine {
 public:
  EngineImpl(const EngineOptions& options, std::unique_ptr<Backend> backend)
      : options_(WithClock(options)),
        backend_(std::move(backend)),
        blocks_(backend_->NumBlocks(), backend_->BlockSize(), options_.now_ms),
        host_(MakeHostTier(options_, *backend_, &host_status_)),
        scheduler_(SchedulerOptions{options.max_num_seqs, options.max_num_batched_tokens,
                                    options.enable_prefix_cache, options.max_prefix_waits,
                                    options.debug_capture_logits,
                                    std::max(1, options.max_prompt_logprob_rows)},
                   &blocks_, host_.get()),
        pin_refs_(blocks_.num_blocks(), 0),
        max_pinned_blocks_(MaxPinnedBlocks(options_.max_pinned_fraction, blocks_.num_blocks())),
        residency_(backend_->BlockSize(), std::max(1, options_.max_chunks_per_block),
                   options_.chunk_events),
        rng_(std::random_device{}()) {
    if (host_ != nullptr) {
      // The write policy (EngineOptions::host_offload_min_uses): a block not taken again while
      // cached is dropped, unless the host holds its key already (Offload then only refreshes
      // that copy's recency).
      blocks_.set_evict_listener([this](int32_t block, const hash::Hash128& key,
                                        const hash::Hash128& parent, const EvictionHints& hints) {
        if (!WorthAHostCopy(block) && !host_->Contains(key)) {
          ++offload_skipped_;
          return;
        }
        host_->Offload(block, key, parent, hints);
      });
      ahead_ticket_.assign(blocks_.num_blocks(), 0);
      blocks_.set_reuse_listener([this](int32_t block) { NoteReuse(block); });
      offload_ahead_ = options_.host_offload_ahead_blocks;
      if (offload_ahead_ < 0) {
        const int64_t per_step =
            (options_.max_num_batched_tokens + blocks_.block_size() - 1) / blocks_.block_size() +
            options_.max_num_seqs;
        offload_ahead_ = std::min<int64_t>(4 * per_step, blocks_.num_blocks() / 4);
      }
    }
    stats_.total_blocks = blocks_.num_blocks();
    stats_.free_blocks = blocks_.num_blocks();
    PublishHostStats();
  }
  // Block copies may still be writing into the host tier's memory (ahead copies run beside the
  // steps), which host_ frees before backend_ goes.
  ~EngineImpl() override {
    if (host_ != nullptr) backend_->WaitBlockCopies().IgnoreError();
  }

  absl::StatusOr<uint64_t> AddRequest(Request req) override;
  void Cancel(uint64_t seq_id) override {
    MutexLock lock(&mu_);
    cancels_.push_back(seq_id);
  }
  int EvictChunks(const std::vector<hash::Hash128>& chunk_hashes) override {
    MutexLock lock(&mu_);
    int found = 0;
    for (const auto& h : chunk_hashes) found += residency_.Contains(h) ? 1 : 0;
    evicts_.insert(evicts_.end(), chunk_hashes.begin(), chunk_hashes.end());
    return found;
  }
  int PinChunks(const std::vector<hash::Hash128>& chunk_hashes, int64_t ttl_ms) override {
    MutexLock lock(&mu_);
    int found = 0;
    for (const auto& h : chunk_hashes) {
      if (!residency_.Contains(h)) continue;
      ++found;
      pin_requests_.push_back({h, ttl_ms});
    }
    return found;
  }
  void ExportBlocks(std::vector<hash::Hash128> keys, int64_t max_bytes,
                    std::function<void(ExportBatch)> done) override {
    MutexLock lock(&mu_);
    exports_.push_back({std::move(keys), max_bytes, std::move(done)});
  }
  int64_t HeldPrefixTokens(const std::vector<hash::PlacedChunk>& placed) const override {
    MutexLock lock(&mu_);
    int64_t held = 0;
    for (const hash::PlacedChunk& c : placed) {
      const int64_t h = residency_.HeldTokens(c.hash);
      if (h <= held) break;
      held = h;
      if (h < c.end) break;  // held only partly: nothing after it is
    }
    return held;
  }
  absl::StatusOr<std::vector<SequenceOutput>> Step() override;
  bool HasWork() const override {
    MutexLock lock(&mu_);
    return !inbox_.empty() || !cancels_.empty() || !evicts_.empty() || !pin_requests_.empty() ||
           !exports_.empty() || live_ > 0 || step_pending_.load();
  }
  EngineStats Stats() const override {
    MutexLock lock(&mu_);
    return stats_;
  }
  std::vector<ChunkEvent> HeldChunks() const override {
    MutexLock lock(&mu_);
    return residency_.Held();
  }
  std::vector<ChunkEvent> TakeChunkEvents() override {
    MutexLock lock(&mu_);
    return residency_.TakeEvents();
  }
  absl::Status HostTierStatus() const override { return host_status_; }
  const EngineOptions& options() const override { return options_; }
  Backend& backend() override { return *backend_; }

 private:
  // What the backend returned for one step: tokens it drew itself (-1 where a whole logits row
  // came back instead) with their logprobs, and those rows, [whole rows, vocab].
  struct StepResult {
    std::vector<float> logits;
    std::vector<int32_t> sampled;
    std::vector<RowLogprobs> logprobs;  // parallel to sampled
  };

  // The step's phases. Intake takes what other threads queued (arrivals, cancels, evictions,
  // pins); Schedule plans a batch; Launch hands it to the backend and advances its sequences
  // (their sampled tokens kPendingToken until collected); Collect waits for the step in flight
  // and applies its tokens (stop and length checks, cancels), FinishRows then commits blocks and
  // fills the outputs; FailScheduled ends a failed step's sequences; EndStep publishes stats and
  // evictions. Without overlap a step is Schedule, Launch, Collect, FinishRows; with it, the
  // next step is scheduled and built while the one launched runs (EngineOptions).
  struct Prepared {
    SchedulerOutput plan;
    ForwardBatch batch;
    std::vector<Scheduler::PendingInput> pending;
    bool speculated = false;  // the backend started it already (Backend::PrepareSampled)
  };
  // One collected row whose output still needs FinishRows.
  struct CollectedRow {
    bool was_prefill = false;
    bool finished = false;  // ended in Collect (retired after FinishRows)
    bool has_logprobs = false;
    int32_t token = -1;
    RowLogprobs logprobs;
    SequenceOutput out;
  };
  std::vector<uint64_t> Intake();
  // Intake's arrivals alone, taken again before the next step is scheduled: a request that
  // arrived while Collect waited for the device starts in that step rather than one later (with
  // the overlapped schedule, two steps after the one it arrived during: with long prefills in
  // flight, a prefill step more of TTFT). Cancels stay for the next Intake; a sequence's cancel
  // never comes before its arrival, since arrivals are taken at least as often.
  void IntakeArrivals();
  void AddArrived(std::vector<std::unique_ptr<Sequence>>* arrived);
  // Offers the prepared step to the backend while inflight_ runs (Backend::PrepareSampled), its
  // inputs sampled by inflight_ fed from that step's rows; whether the backend started it. Not
  // offered where the step has penalty lists or prompt-logprob rows (their inputs are filled on
  // the host) or host copies wait to run before it.
  bool Speculate(const Prepared& p);
  // The step with dropped rows was collected (or failed): their sequences retire now.
  void ReleaseDropped();
  // AddRequest's bound on waiting requests (EngineOptions::max_waiting).
  bool QueueFullLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stats_.waiting + static_cast<int64_t>(inbox_.size()) >= options_.max_waiting;
  }
  bool QueueFull() const {
    MutexLock lock(&mu_);
    return QueueFullLocked();
  }
  absl::Status QueueFullError() const {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the worker's queue is full (", options_.max_waiting, " waiting requests); retry later"));
  }
  SchedulerOutput Schedule(std::vector<SequenceOutput>* outputs);
  // Builds and launches `plan`; on failure its sequences end (kError).
  void BuildAndLaunch(SchedulerOutput plan, std::vector<SequenceOutput>* outputs);
  // speculated: the backend started this batch already (Prepared::speculated).
  absl::Status Launch(SchedulerOutput plan, ForwardBatch* batch,
                      const std::vector<Scheduler::PendingInput>& pending, bool speculated = false);
  void Collect(const std::vector<uint64_t>& cancels, std::vector<SequenceOutput>* outputs,
               std::vector<CollectedRow>* rows);
  void FinishRows(std::vector<CollectedRow>* rows, std::vector<SequenceOutput>* outputs);
  // Drops from prepared_ the sequences that ended (or are cancelled) since it was scheduled.
  void PruneFinished(const std::vector<uint64_t>& cancels);
  void FailScheduled(const SchedulerOutput& plan, const absl::Status& st,
                     std::vector<SequenceOutput>* outputs);
  void EndStep();

  // Intake's parts.
  void ApplyEvictions() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyPinRequests() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyCancels(const std::vector<uint64_t>& cancels, std::vector<SequenceOutput>* outputs);
  void ExpirePins();
  // Peer fetch: writes arrived sequences' peer blocks into the host tier (within the step's
  // import budget; a sequence waits for admission until its blocks are in), and answers peers'
  // export requests (within the export budget).
  void ImportPeerBlocks();
  void ServeExports();
  // Forgets a finished sequence.
  void Retire(uint64_t seq_id);

  hash::Hash128 KeyFor(Sequence& seq, int64_t j);
  void CommitBlocks(Sequence& seq);
  void Finish(Sequence& seq, FinishReason reason, SequenceOutput& out);
  // Fills a sequence's first output: where its chunks sit and how much came from the cache.
  void Started(Sequence& seq, SequenceOutput& out);
  // Applies one collected row's token (`logits_row`: the row's logits when the backend sent it
  // whole, else null and `row->token` is the backend's draw).
  void CollectRow(const ScheduledSeq& s, const float* logits_row, CollectedRow* row);
  void TakePins(Sequence& seq);
  // Pins `chunk` on `blocks` (its chain, root first) until `expires_ms`, unless that would put
  // more than max_pinned_blocks_ blocks under pins or make more pins than that; returns whether
  // it did (the caller counts a refusal). REQUIRES: the chunk is not pinned.
  bool AddPin(const hash::Hash128& chunk, std::vector<int32_t> blocks, int64_t expires_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleasePin(const hash::Hash128& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishStats() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishHostStats() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Raises the eviction hints of the prompt's committed blocks to the request's.
  void ApplyHints(Sequence& seq);
  // Hands the host tier's recorded copies to the backend, in order. On failure the copies'
  // keys are dropped (their bytes are not known good) once nothing references them.
  absl::Status FlushHostCopies();
  // Offloading ahead of eviction (EngineOptions::host_offload_ahead_blocks). OffloadAhead
  // records copies of the blocks eviction would take next that the host lacks; NoteReuse (the
  // block manager's reuse listener) notes a block handed out while its ahead copy may still be
  // reading it; OrderReuse makes the next step wait for such copies on the device.
  void OffloadAhead();
  void NoteReuse(int32_t block);
  absl::Status OrderReuse();
  // The host tier's write policy (EngineOptions::host_offload_min_uses), at eviction and ahead.
  bool WorthAHostCopy(int32_t block) const {
    return blocks_.Uses(block) >= options_.host_offload_min_uses;
  }
  static int64_t MaxPinnedBlocks(double fraction, int64_t num_blocks) {
    if (!(fraction > 0)) return 0;  // (NaN too)
    if (fraction >= 1) return num_blocks;
    return static_cast<int64_t>(fraction * static_cast<double>(num_blocks));
  }
  static EngineOptions WithClock(EngineOptions o) {
    if (!o.now_ms) o.now_ms = SteadyNowMs;
    return o;
  }

  // Set at construction.
  const EngineOptions options_;
  std::unique_ptr<Backend> backend_;

  // Owned by the step thread.
  BlockManager blocks_;
  absl::Status host_status_;
  std::unique_ptr<HostKvTier> host_;            // null when the host tier is off
  std::vector<hash::Hash128> failed_restores_;  // restored keys whose copy failed
  std::vector<hash::Hash128> restored_;         // keys restored this step (tier -> GPU)
  int64_t host_copy_failures_ = 0;
  int64_t offload_ahead_ = 0;           // resolved host_offload_ahead_blocks (0: off)
  std::vector<uint64_t> ahead_ticket_;  // [num_blocks] ticket of its last ahead copy, 0: none
  uint64_t ahead_done_ = 0;             // Backend::AheadCopiesDone() when last asked
  uint64_t reuse_wait_ = 0;             // ticket the next step must run after (0: none)
  int64_t offload_waits_ = 0;           // EngineStats::host_offload_waits
  int64_t offload_skipped_ = 0;         // EngineStats::host_offload_skipped_blocks
  // Sequences whose peer blocks are being imported (ids, in arrival order), and their progress.
  std::deque<uint64_t> importing_;
  int64_t peer_imported_ = 0;
  int64_t peer_exported_ = 0;
  Scheduler scheduler_;
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  struct Pin {
    std::vector<int32_t> blocks;
    int64_t expires_ms = 0;
  };
  std::unordered_map<hash::Hash128, Pin, hash::Hash128Hasher> pins_;
  std::vector<int32_t> pin_refs_;  // [num_blocks] pins holding each block
  int64_t pinned_blocks_ = 0;      // blocks with pin_refs_ > 0
  const int64_t max_pinned_blocks_;
  int64_t pins_refused_ = 0;
  // Registry pins refused by the cap -> when their last renewal lapses: a renewal of one of them
  // tries again but is not counted again (the registry renews every pin each heartbeat).
  std::unordered_map<hash::Hash128, int64_t, hash::Hash128Hasher> refused_pins_;
  std::optional<SchedulerOutput> inflight_;  // launched, not yet collected
  std::optional<Prepared> prepared_;         // scheduled while inflight_ runs (overlap)
  // Batches kept between steps for their vectors' capacity (Scheduler::BuildBatch empties a
  // batch without freeing): the plain schedule's, and the overlapped schedule's spare.
  ForwardBatch launch_batch_, spare_batch_;
  std::atomic<bool> step_pending_{false};  // inflight_ or prepared_ set (HasWork)
  int64_t prompt_tokens_computed_ = 0;
  int64_t generation_tokens_ = 0;
  int64_t steps_ = 0;
  int64_t overlapped_steps_ = 0;                                // EngineStats::overlapped_steps
  int64_t speculated_steps_ = 0, speculated_rows_dropped_ = 0;  // EngineStats
  int64_t speculation_declined_[3] = {};                        // EngineStats
  // Sequences with a dropped row in the step in flight (ScheduledSeq::dropped): their Retire waits
  // until that step is collected (the plan points at them), in retire_later_.
  std::vector<uint64_t> dropped_ids_, retire_later_;

  mutable Mutex mu_;
  std::vector<std::unique_ptr<Sequence>> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> cancels_ ABSL_GUARDED_BY(mu_);
  std::vector<hash::Hash128> evicts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<hash::Hash128, int64_t>> pin_requests_ ABSL_GUARDED_BY(mu_);
  std::deque<ExportRequest> exports_ ABSL_GUARDED_BY(mu_);
  Residency residency_ ABSL_GUARDED_BY(mu_);
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;  // admitted, not yet finished
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_arrival_ ABSL_GUARDED_BY(mu_) = 0;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<uint64_t> EngineImpl::AddRequest(Request req) {
  const int vocab = backend_->VocabSize();
  auto seq = std::make_unique<Sequence>();
  for (size_t i = 0; i < req.chunks.size(); ++i) {
    const ChunkInput& c = req.chunks[i];
    for (size_t j = 0; j < c.tokens.size(); ++j) {
      if (c.tokens[j] < 0 || c.tokens[j] >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("chunks[", i, "].token_ids[", j, "] = ", c.tokens[j],
                         " is outside the vocabulary [0, ", vocab, ")"));
      }
    }
    seq->tokens.insert(seq->tokens.end(), c.tokens.begin(), c.tokens.end());
    seq->chunk_kinds.push_back(c.kind);
  }
  if (seq->tokens.empty()) return absl::InvalidArgumentError("chunks: the prompt has no tokens");
  if (absl::Status s = ValidateSampling(req.sampling, vocab, options_.max_tokens_limit); !s.ok()) {
    return s;
  }
  const int64_t prompt_len = static_cast<int64_t>(seq->tokens.size());
  if (req.resumed_tokens < 0 || req.resumed_tokens >= prompt_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("resumed_tokens = ", req.resumed_tokens, " must be in [0, ", prompt_len,
                     ") (the prompt's tokens that an earlier attempt generated)"));
  }
  if (prompt_len + req.sampling.max_tokens > options_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt (", prompt_len, " tokens) plus sampling.max_tokens (", req.sampling.max_tokens,
        ") exceeds the model's context length (", options_.max_context, " tokens)"));
  }
  const int bs = backend_->BlockSize();
  if ((prompt_len + req.sampling.max_tokens + bs - 1) / bs > blocks_.num_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the prompt plus sampling.max_tokens needs ", prompt_len + req.sampling.max_tokens,
        " tokens of KV cache but this worker holds ", blocks_.num_blocks() * bs));
  }

  // A full queue refuses before the prompt is hashed and its listed tokens folded (a long prompt's
  // milliseconds, which an overloaded worker should not spend on requests it turns away); the
  // check under the lock below stays the one that holds.
  if (QueueFull()) return QueueFullError();

  seq->request_id = std::move(req.request_id);
  seq->sampling = req.sampling;
  seq->pin_ttl_ms = std::max<int64_t>(0, req.pin_ttl_ms);
  seq->hints.priority = req.priority;
  if (req.retention_ms > 0) seq->hints.retain_until_ms = options_.now_ms() + req.retention_ms;
  seq->prompt_len = prompt_len;
  seq->output_start = static_cast<size_t>(prompt_len - req.resumed_tokens);
  seq->stop_ban = StopBanOf(seq->sampling, options_.eos_token_ids, vocab);
  ListBanned(seq->stop_ban, &seq->sampling);
  StartListed(seq->sampling, &seq->listed_tokens, &seq->listed_counts, &seq->listed_bias);
  // The prompt's tokens folded into the list here, on the caller's thread: for a long prompt
  // with penalties that is a sort of its tokens (~2 ms for 32k), which on the engine thread
  // (FillPenalties, where later tokens fold in) would stall every running request's step.
  AdvanceListed(seq.get(), [](int32_t, bool) {});
  const std::vector<hash::ChunkSpec> specs = hash::SpecsOf(req.chunks);
  seq->chunks = req.placed.size() == req.chunks.size()
                    ? std::move(req.placed)
                    : hash::PlaceChunks(options_.model_name, req.cache_salt, specs);
  seq->tail_salt = seq->chunks.back().salt_state;
  seq->peer_blocks = std::move(req.peer_blocks);
  if (options_.debug_unchained_block_keys) {
    for (int64_t j = 0; j + 1 <= prompt_len / bs; ++j) {
      size_t c = 0;
      while (seq->chunks[c].end <= (j + 1) * bs - 1) ++c;
      seq->block_keys.push_back(hash::BlockHash({}, options_.model_name, seq->chunks[c].salt_state,
                                                std::span(seq->tokens.data() + j * bs, bs)));
    }
  } else {
    seq->block_keys = hash::BlockKeys(options_.model_name, seq->chunks, specs, bs);
  }

  MutexLock lock(&mu_);
  if (QueueFullLocked()) return QueueFullError();
  seq->seed = req.sampling.seed.has_value() ? *req.sampling.seed : rng_();
  seq->id = next_id_++;
  seq->arrival = next_arrival_++;
  const uint64_t id = seq->id;
  inbox_.push_back(std::move(seq));
  ++live_;
  return id;
}

hash::Hash128 EngineImpl::KeyFor(Sequence& seq, int64_t j) {
  const int bs = backend_->BlockSize();
  while (static_cast<int64_t>(seq.block_keys.size()) <= j) {
    const int64_t k = static_cast<int64_t>(seq.block_keys.size());
    // Blocks past the prompt's full blocks end in generated tokens: the tail salt applies.
    hash::Hash128 prev =
        (k == 0 || options_.debug_unchained_block_keys) ? hash::Hash128{} : seq.block_keys[k - 1];
    seq.block_keys.push_back(hash::BlockHash(prev, options_.model_name, seq.tail_salt,
                                             std::span(seq.tokens.data() + k * bs, bs)));
  }
  return seq.block_keys[j];
}

void EngineImpl::CommitBlocks(Sequence& seq) {
  const int bs = backend_->BlockSize();
  // Tokens a step in flight is computing are not committed until it has finished.
  while ((seq.num_committed + 1) * bs <= seq.num_computed - seq.inflight_tokens) {
    const int64_t j = seq.num_committed;
    const hash::Hash128 parent = j == 0 ? hash::Hash128{} : KeyFor(seq, j - 1);
    blocks_.Commit(seq.block_table[j], KeyFor(seq, j), parent);
    ++seq.num_committed;
  }
}

void EngineImpl::TakePins(Sequence& seq) {
  // Each chunk is pinned through the last full block inside it, so later requests with the same
  // leading chunks find them whatever the LRU does. A chunk in which no full block ends holds
  // nothing the chunks before it do not (residency does not list it either): it is not pinned,
  // so a request has at most one pin per prompt block.
  const int bs = backend_->BlockSize();
  MutexLock lock(&mu_);  // (residency_ learns which chunks are pinned)
  for (const hash::PlacedChunk& c : seq.chunks) {
    const int64_t nblocks = std::min<int64_t>(c.end / bs, seq.num_committed);
    if (nblocks <= c.start / bs) continue;
    if (auto it = pins_.find(c.hash); it != pins_.end()) {
      it->second.expires_ms = std::max(it->second.expires_ms, options_.now_ms() + seq.pin_ttl_ms);
      continue;
    }
    // Each request asks once: a refusal here is one refused pin.
    if (!AddPin(c.hash,
                std::vector<int32_t>(seq.block_table.begin(), seq.block_table.begin() + nblocks),
                options_.now_ms() + seq.pin_ttl_ms)) {
      ++pins_refused_;
    }
  }
  seq.pinned = true;
}

bool EngineImpl::AddPin(const hash::Hash128& chunk, std::vector<int32_t> blocks,
                        int64_t expires_ms) {
  int64_t fresh = 0;  // blocks no pin holds yet (a chain's blocks are distinct)
  for (int32_t b : blocks) fresh += pin_refs_[b] == 0 ? 1 : 0;
  // Pins are capped by number too: every pin has a block ending in its chunk, so only the same
  // blocks under other chunk boundaries (or kinds) could pass it, and each pin is a chain of
  // block references that ExpirePins visits every step.
  if (pinned_blocks_ + fresh > max_pinned_blocks_ ||
      static_cast<int64_t>(pins_.size()) >= max_pinned_blocks_) {
    return false;
  }
  for (int32_t b : blocks) {
    blocks_.AddRef(b);
    if (pin_refs_[b]++ == 0) ++pinned_blocks_;
  }
  pins_.emplace(chunk, Pin{std::move(blocks), expires_ms});
  residency_.SetPinned(chunk, true);
  return true;
}

void EngineImpl::ReleasePin(const hash::Hash128& chunk) {
  auto it = pins_.find(chunk);
  if (it == pins_.end()) return;
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) {
    blocks_.Release(*b);
    if (--pin_refs_[*b] == 0) --pinned_blocks_;
  }
  pins_.erase(it);
  residency_.SetPinned(chunk, false);
}

void EngineImpl::Finish(Sequence& seq, FinishReason reason, SequenceOutput& out) {
  if (seq.pin_ttl_ms > 0 && !seq.pinned && seq.num_computed >= seq.prompt_len) TakePins(seq);
  out.finished = true;
  out.finish_reason = reason;
  out.prompt_tokens = seq.prompt_len;
  out.cached_tokens = seq.cached_tokens;
  out.completion_tokens = seq.num_generated;
  scheduler_.Remove(&seq);
}

void EngineImpl::CollectRow(const ScheduledSeq& s, const float* logits_row, CollectedRow* row) {
  Sequence& seq = *s.seq;
  SequenceOutput& out = row->out;
  if (!s.wants_logits) return;
  // The step's token stands at the end of the tokens as kPendingToken.
  seq.tokens.pop_back();
  seq.last_token_in_flight = false;
  const int vocab = backend_->VocabSize();
  const int64_t position = static_cast<int64_t>(seq.tokens.size());
  SampleResult r;
  if (logits_row == nullptr) {
    r.token_id = row->token;
    row->has_logprobs = seq.sampling.logprobs > 0;
  } else {
    std::vector<float> vrow(logits_row, logits_row + vocab);
    if (options_.debug_capture_logits) out.logits.push_back(vrow);
    r = Sample(vrow,
               Banning(seq, position) ? BannedParams(seq.sampling, seq.stop_ban) : seq.sampling,
               seq.seed, position, seq.tokens, seq.output_start);
    if (seq.sampling.logprobs > 0) out.logprobs.push_back(std::move(r.logprobs));
  }
  ++seq.num_generated;
  ++generation_tokens_;
  const int32_t t = r.token_id;
  row->token = t;
  const auto& eos = options_.eos_token_ids;
  const bool is_eos = !seq.sampling.ignore_eos && std::find(eos.begin(), eos.end(), t) != eos.end();
  const auto& stops = seq.sampling.stop_token_ids;
  auto end_here = [&](FinishReason reason) {
    // The blocks are committed (and reported) before Finish() frees them.
    CommitBlocks(seq);
    if (row->was_prefill) ApplyHints(seq);
    {
      MutexLock lock(&mu_);
      residency_.Update(seq);
    }
    Finish(seq, reason, out);
    row->finished = true;
  };
  if (is_eos || std::find(stops.begin(), stops.end(), t) != stops.end()) {
    out.stop_token_id = t;
    row->has_logprobs = false;
    out.logprobs.clear();
    end_here(FinishReason::kStop);
    return;
  }
  seq.tokens.push_back(t);
  out.new_tokens.push_back(t);
  if (seq.num_generated >= seq.sampling.max_tokens ||
      static_cast<int64_t>(seq.tokens.size()) >= options_.max_context) {
    end_here(FinishReason::kLength);
  }
}

void EngineImpl::ApplyHints(Sequence& seq) {
  if (seq.hints.priority == 0 && seq.hints.retain_until_ms == 0) return;
  const int64_t n = std::min<int64_t>(seq.num_committed, seq.prompt_len / backend_->BlockSize());
  for (int64_t j = 0; j < n; ++j) blocks_.RaiseHints(seq.block_table[j], seq.hints);
}

void EngineImpl::OffloadAhead() {
  if (offload_ahead_ <= 0) return;
  blocks_.ForNextVictims(offload_ahead_ - blocks_.NumFree(),
                         [&](int32_t block, const hash::Hash128& key, const hash::Hash128& parent,
                             const EvictionHints& hints) {
                           // (the policy's array read before the host index's lookup)
                           if (WorthAHostCopy(block) && !host_->Contains(key)) {
                             host_->OffloadAhead(block, key, parent, hints);
                           }
                           return true;
                         });
}

void EngineImpl::NoteReuse(int32_t block) {
  const uint64_t t = ahead_ticket_[block];
  if (t == 0) return;
  ahead_ticket_[block] = 0;
  if (t > ahead_done_) ahead_done_ = backend_->AheadCopiesDone();
  if (t > ahead_done_) reuse_wait_ = std::max(reuse_wait_, t);
}

absl::Status EngineImpl::OrderReuse() {
  bool evicted_dirty = false;
  if (host_ != nullptr) {
    for (const HostCopyOp& op : host_->PendingCopies()) evicted_dirty |= op.to_host && !op.ahead;
  }
  if (evicted_dirty || reuse_wait_ > 0) ++offload_waits_;
  if (reuse_wait_ == 0) return absl::OkStatus();
  if (absl::Status st = backend_->OrderAfterAheadCopies(reuse_wait_); !st.ok()) return st;
  reuse_wait_ = 0;
  return absl::OkStatus();
}

absl::Status EngineImpl::FlushHostCopies() {
  if (host_ == nullptr) return absl::OkStatus();
  const std::vector<HostCopyOp> ops = host_->TakeCopies();
  absl::Status st;
  std::vector<BlockCopy> run;
  for (size_t i = 0; i < ops.size() && st.ok(); ++i) {
    run.push_back(ops[i].copy);
    if (i + 1 < ops.size() && ops[i + 1].to_host == ops[i].to_host &&
        ops[i + 1].ahead == ops[i].ahead) {
      continue;
    }
    if (ops[i].ahead) {
      absl::StatusOr<uint64_t> ticket = backend_->CopyBlocksToHostAhead(run);
      st = ticket.status();
      for (size_t j = i + 1 - run.size(); ticket.ok() && j <= i; ++j) {
        ahead_ticket_[ops[j].copy.block] = *ticket;
      }
    } else {
      st = ops[i].to_host ? backend_->CopyBlocksToHost(run) : backend_->CopyBlocksFromHost(run);
    }
    run.clear();
  }
  if (st.ok()) {
    for (const HostCopyOp& op : ops) {
      if (!op.to_host) restored_.push_back(op.key);
    }
    return st;
  }
  ++host_copy_failures_;
  std::vector<hash::Hash128> offloaded;
  for (const HostCopyOp& op : ops) {
    (op.to_host ? offloaded : failed_restores_).push_back(op.key);
  }
  host_->Erase(offloaded);
  return st;
}

void EngineImpl::PublishHostStats() {
  if (host_ == nullptr) return;
  const HostTierStats h = host_->Stats();
  stats_.host_total_blocks = h.slots;
  stats_.host_used_blocks = h.used;
  stats_.host_offloaded_blocks = h.offloaded;
  stats_.host_offloaded_ahead_blocks = h.offloaded_ahead;
  stats_.host_offload_waits = offload_waits_;
  stats_.host_offload_skipped_blocks = offload_skipped_;
  stats_.host_restored_blocks = h.restored;
  stats_.host_evicted_blocks = h.evicted;
  stats_.host_copy_failures = host_copy_failures_;
}

void EngineImpl::PublishStats() {
  stats_.running = scheduler_.num_running();
  stats_.waiting = scheduler_.num_waiting();
  stats_.total_blocks = blocks_.num_blocks();
  stats_.free_blocks = blocks_.NumAvailable();
  stats_.used_blocks = blocks_.NumInUse();
  stats_.cached_blocks = blocks_.NumCached();
  stats_.prefix_cache_queries = scheduler_.prefix_queries();
  stats_.prefix_cache_hits = scheduler_.prefix_hits();
  stats_.prefix_cache_hits_host = scheduler_.prefix_hits_host();
  PublishHostStats();
  stats_.peer_imported_blocks = peer_imported_;
  stats_.peer_exported_blocks = peer_exported_;
  stats_.preemptions = scheduler_.preemptions();
  stats_.pinned_chunks = static_cast<int64_t>(pins_.size());
  stats_.pinned_blocks = pinned_blocks_;
  stats_.pins_refused = pins_refused_;
  stats_.held_chunks = residency_.size();
  stats_.held_chunks_displaced = residency_.displaced();
  stats_.prompt_tokens_computed = prompt_tokens_computed_;
  stats_.generation_tokens = generation_tokens_;
  stats_.steps = steps_;
  stats_.overlapped_steps = overlapped_steps_;
  stats_.speculated_steps = speculated_steps_;
  stats_.speculated_rows_dropped = speculated_rows_dropped_;
  for (int i = 0; i < 3; ++i) stats_.speculation_declined[i] = speculation_declined_[i];
}

absl::StatusOr<std::vector<SequenceOutput>> EngineImpl::Step() {
  std::vector<SequenceOutput> outputs;
  const std::vector<uint64_t> cancels = Intake();
  std::vector<CollectedRow> rows;
  // The step in flight first, then at once the one prepared while it ran (overlap), so the
  // device idles only for the wait, the prepared batch's last tokens and the launch.
  if (inflight_.has_value()) Collect(cancels, &outputs, &rows);
  if (prepared_.has_value()) PruneFinished(cancels);
  ApplyCancels(cancels, &outputs);
  ImportPeerBlocks();
  ServeExports();
  ExpirePins();
  std::vector<SequenceOutput> failed;  // after the collected step's outputs
  if (prepared_.has_value()) {
    Prepared p = std::move(*prepared_);
    prepared_.reset();
    if (!p.plan.scheduled.empty()) {
      const SchedulerOutput plan = p.plan;
      if (absl::Status st = Launch(std::move(p.plan), &p.batch, p.pending, p.speculated);
          !st.ok()) {
        FailScheduled(plan, st, &failed);
        ReleaseDropped();
      }
    }
    spare_batch_ = std::move(p.batch);  // its capacity serves the next prepared step
  }
  FinishRows(&rows, &outputs);
  for (SequenceOutput& o : failed) outputs.push_back(std::move(o));
  IntakeArrivals();  // what arrived while Collect waited joins the step scheduled next
  if (!inflight_.has_value()) {
    SchedulerOutput plan = Schedule(&outputs);
    if (!plan.scheduled.empty()) BuildAndLaunch(std::move(plan), &outputs);
  }
  const bool overlap =
      options_.overlap_schedule && inflight_.has_value() &&
      static_cast<int64_t>(inflight_->scheduled.size()) >= options_.overlap_min_rows;
  if (overlap) {
    // Scheduled as if every sequence of the step in flight went on (kPendingToken stands for its
    // tokens); PruneFinished corrects that before the launch.
    SchedulerOutput plan = Schedule(&outputs);
    if (!plan.scheduled.empty()) {
      Prepared p;
      p.plan = std::move(plan);
      p.batch = std::move(spare_batch_);
      scheduler_.BuildBatch(p.plan, backend_->BlockSize(), &p.batch, &p.pending);
      p.speculated = Speculate(p);
      prepared_ = std::move(p);
      ++overlapped_steps_;
    }
  } else if (inflight_.has_value()) {
    Collect({}, &outputs, &rows);
    FinishRows(&rows, &outputs);
  }
  step_pending_.store(inflight_.has_value() || prepared_.has_value());
  EndStep();
  return outputs;
}

std::vector<uint64_t> EngineImpl::Intake() {
  std::vector<std::unique_ptr<Sequence>> arrived;
  std::vector<uint64_t> cancels;
  {
    MutexLock lock(&mu_);
    arrived.swap(inbox_);
    cancels.swap(cancels_);
    ApplyEvictions();
    ApplyPinRequests();
  }
  AddArrived(&arrived);
  return cancels;
}

void EngineImpl::IntakeArrivals() {
  std::vector<std::unique_ptr<Sequence>> arrived;
  {
    MutexLock lock(&mu_);
    if (inbox_.empty()) return;
    arrived.swap(inbox_);
  }
  AddArrived(&arrived);
}

void EngineImpl::AddArrived(std::vector<std::unique_ptr<Sequence>>* arrived) {
  for (auto& seq : *arrived) {
    Sequence* s = seq.get();
    seqs_.emplace(seq->id, std::move(seq));
    if (s->peer_blocks.empty() || host_ == nullptr) {
      s->peer_blocks.clear();
      scheduler_.AddWaiting(s);
    } else {
      // By id: a cancel in the same intake retires the sequence before its import starts.
      importing_.push_back(s->id);
    }
  }
}

void EngineImpl::ImportPeerBlocks() {
  if (importing_.empty()) return;
  // Host slots may be read or written by copies still in flight.
  if (absl::Status st = backend_->WaitBlockCopies(); !st.ok()) return;  // retried next step
  int64_t budget = options_.import_bytes_per_step;
  while (!importing_.empty()) {
    auto it = seqs_.find(importing_.front());
    if (it == seqs_.end() || it->second->state == SeqState::kFinished) {
      importing_.pop_front();  // cancelled meanwhile
      continue;
    }
    Sequence& seq = *it->second;
    if (budget <= 0) break;
    std::vector<hash::Hash128> keys;
    for (const PeerBlock& b : seq.peer_blocks) keys.push_back(b.key);
    // The sequence's own blocks must not evict one another.
    host_->Protect(keys);
    peer_imported_ +=
        ImportBlocks(seq.peer_blocks, &seq.peer_next, &budget, blocks_, host_.get(), seq.hints);
    host_->Unprotect();
    if (seq.peer_next < seq.peer_blocks.size()) break;  // budget spent: next step
    seq.peer_blocks.clear();
    seq.peer_blocks.shrink_to_fit();
    scheduler_.AddWaiting(&seq);
    importing_.pop_front();
  }
}

void EngineImpl::ServeExports() {
  std::vector<ExportRequest> batch;
  {
    MutexLock lock(&mu_);
    int64_t budget = options_.export_bytes_per_step;
    while (!exports_.empty() && budget > 0) {
      budget -= std::max<int64_t>(exports_.front().max_bytes, 1);
      batch.push_back(std::move(exports_.front()));
      exports_.pop_front();
    }
  }
  if (batch.empty()) return;
  std::vector<ExportBatch> out = CopyOutBlocks(batch, blocks_, host_.get(), *backend_);
  for (size_t i = 0; i < batch.size(); ++i) {
    peer_exported_ += static_cast<int64_t>(out[i].blocks.size());
    batch[i].done(std::move(out[i]));
  }
}

void EngineImpl::ApplyEvictions() {
  std::vector<hash::Hash128> evicts;
  evicts.swap(evicts_);
  if (evicts.empty()) return;
  // One descendant search for all the chunks, after every pin among them is released (a chunk's
  // pin holds its ancestors, which may be another evicted chunk's blocks).
  std::vector<hash::Hash128> keys;
  for (const hash::Hash128& h : evicts) {
    ReleasePin(h);
    const std::vector<hash::Hash128> k = residency_.BlockKeysOf(h);
    keys.insert(keys.end(), k.begin(), k.end());
  }
  std::vector<hash::Hash128> covered;
  blocks_.EvictKeys(keys, &covered);
  // The host copies below every GPU block the eviction covered go too, not only those below the
  // chunks' own keys: a host copy whose parent was on the GPU alone is unreachable once that
  // parent is dropped, and the chunks held through it would stay claimed in the registry. EndStep
  // reports the keys gone from both tiers, which withdraws those chunks.
  if (host_ != nullptr) host_->Erase(covered);
}

void EngineImpl::ApplyPinRequests() {
  const int64_t now = options_.now_ms();
  for (const auto& [h, ttl] : pin_requests_) {
    auto it = pins_.find(h);
    if (it != pins_.end()) {
      it->second.expires_ms = std::max(it->second.expires_ms, now + ttl);
      continue;
    }
    std::optional<hash::Hash128> last = residency_.LastKeyOf(h);
    if (!last) continue;
    std::vector<int32_t> blocks = blocks_.ChainBlocks(*last);
    if (blocks.empty()) continue;
    if (AddPin(h, std::move(blocks), now + ttl)) {
      refused_pins_.erase(h);
      continue;
    }
    // Counted when the registry's pin is first refused, not at each renewal that still is.
    auto [r, first] = refused_pins_.try_emplace(h, now + ttl);
    if (first || r->second <= now) ++pins_refused_;
    r->second = std::max(r->second, now + ttl);
  }
  pin_requests_.clear();
}

void EngineImpl::ApplyCancels(const std::vector<uint64_t>& cancels,
                              std::vector<SequenceOutput>* outputs) {
  for (uint64_t id : cancels) {
    auto it = seqs_.find(id);
    // (A sequence that ended with a row in a speculated step lives until that step is collected.)
    if (it == seqs_.end() || it->second->state == SeqState::kFinished) continue;
    SequenceOutput out;
    out.seq_id = id;
    Finish(*it->second, FinishReason::kCancelled, out);
    outputs->push_back(std::move(out));
    Retire(id);
  }
}

void EngineImpl::ExpirePins() {
  // Pins past their time go back to the LRU.
  const int64_t now = options_.now_ms();
  std::vector<hash::Hash128> expired;
  for (const auto& [h, pin] : pins_) {
    if (pin.expires_ms <= now) expired.push_back(h);
  }
  // Refused registry pins no longer renewed: a later pin of theirs is a new request.
  std::erase_if(refused_pins_, [now](const auto& r) { return r.second <= now; });
  MutexLock lock(&mu_);
  for (const auto& h : expired) ReleasePin(h);
}

void EngineImpl::Retire(uint64_t seq_id) {
  if (std::find(dropped_ids_.begin(), dropped_ids_.end(), seq_id) != dropped_ids_.end()) {
    retire_later_.push_back(seq_id);  // a step in flight still names it
    return;
  }
  seqs_.erase(seq_id);
  MutexLock lock(&mu_);
  --live_;
}

SchedulerOutput EngineImpl::Schedule(std::vector<SequenceOutput>* outputs) {
  SchedulerOutput plan = scheduler_.Schedule();
  if (plan.scheduled.empty() && scheduler_.num_running() == 0 && scheduler_.num_waiting() > 0) {
    // Nothing runs and the head of the queue cannot be admitted: pinned blocks hold the KV it
    // needs. Failing it beats waiting forever.
    Sequence* head = scheduler_.waiting_front();
    const uint64_t id = head->id;
    SequenceOutput out;
    out.seq_id = id;
    out.status = absl::ResourceExhaustedError(
        absl::StrCat("the KV cache is held by pinned chunks; ", blocks_.NumAvailable(), " of ",
                     blocks_.num_blocks(), " blocks are free"));
    Finish(*head, FinishReason::kError, out);
    outputs->push_back(std::move(out));
    Retire(id);
  }
  return plan;
}

void EngineImpl::BuildAndLaunch(SchedulerOutput plan, std::vector<SequenceOutput>* outputs) {
  ForwardBatch& batch = launch_batch_;  // (BuildBatch empties it, keeping its capacity)
  scheduler_.BuildBatch(plan, backend_->BlockSize(), &batch);
  const SchedulerOutput copy = plan;
  if (absl::Status st = Launch(std::move(plan), &batch, {}); !st.ok()) {
    FailScheduled(copy, st, outputs);
  }
}

absl::Status EngineImpl::Launch(SchedulerOutput plan, ForwardBatch* batch,
                                const std::vector<Scheduler::PendingInput>& pending,
                                bool speculated) {
  // A speculated batch goes as it was started: its fed inputs come from the device (and a dropped
  // row's sequence may have no token there).
  if (!speculated) scheduler_.FillPending(plan, pending, batch);
  // A speculated step ordered itself (Speculate).
  if (!speculated) {
    if (absl::Status st = OrderReuse(); !st.ok()) return st;
  }
  // Offloads and restores decided while scheduling run before the step (Backend's contract);
  // with them the copies ahead of the next evictions, which it does not wait for.
  if (host_ != nullptr) OffloadAhead();
  if (absl::Status st = FlushHostCopies(); !st.ok()) return st;
  if (absl::Status st = backend_->LaunchSampled(*batch); !st.ok()) return st;
  if (speculated) ++speculated_steps_;
  for (ScheduledSeq& s : plan.scheduled) {
    if (s.dropped) continue;
    Sequence& seq = *s.seq;
    s.was_prefill = seq.num_computed < seq.prompt_len;
    seq.num_computed += s.num_tokens;
    seq.inflight_tokens = s.num_tokens;
    if (s.was_prefill) {
      prompt_tokens_computed_ +=
          std::min(seq.num_computed, seq.prompt_len) - (seq.num_computed - s.num_tokens);
    }
    if (s.wants_logits) {
      seq.tokens.push_back(kPendingToken);
      seq.last_token_in_flight = seq.num_generated + 1 >= seq.sampling.max_tokens ||
                                 static_cast<int64_t>(seq.tokens.size()) >= options_.max_context;
    }
  }
  inflight_ = std::move(plan);
  return absl::OkStatus();
}

void EngineImpl::Collect(const std::vector<uint64_t>& cancels, std::vector<SequenceOutput>* outputs,
                         std::vector<CollectedRow>* rows) {
  SchedulerOutput plan = std::move(*inflight_);
  inflight_.reset();
  StepResult result;
  const absl::Status st =
      backend_->FinishSampled(&result.logits, &result.sampled, &result.logprobs);
  for (const ScheduledSeq& s : plan.scheduled) {
    if (!s.dropped) s.seq->inflight_tokens = 0;
  }
  if (!st.ok()) {
    for (const ScheduledSeq& s : plan.scheduled) {
      if (s.dropped) continue;
      if (s.wants_logits) s.seq->tokens.pop_back();
      s.seq->last_token_in_flight = false;
    }
    prepared_.reset();  // its sequences stay running and are scheduled again
    FailScheduled(plan, st, outputs);
    ReleaseDropped();
    return;
  }
  size_t row = 0, full_row = 0;
  rows->reserve(rows->size() + plan.scheduled.size());  // (a row is ~0.5 KB: no regrowth)
  for (const ScheduledSeq& s : plan.scheduled) {
    if (s.dropped) {  // (a speculated step's rows sample only: no prompt rows)
      if (s.wants_logits) full_row += result.sampled[row++] < 0 ? 1 : 0;
      continue;
    }
    CollectedRow c;
    c.was_prefill = s.was_prefill;
    c.out.seq_id = s.seq->id;
    if (s.newly_admitted) Started(*s.seq, c.out);
    // Prompt-logprob rows (before the sampled row): row r at position p scores the prompt token
    // at p + 1; scored by the backend (a score row), or whole where tests capture logits.
    for (int32_t r = 0; r < s.prompt_rows; ++r, ++row) {
      const float* prow = nullptr;
      if (result.sampled[row] < 0)
        prow = result.logits.data() + (full_row++) * backend_->VocabSize();
      Sequence& seq = *s.seq;
      const int64_t next = s.prompt_row_first + r + 1;
      if (next != seq.prompt_logprobs_next) continue;  // (emitted before a preemption)
      RowLogprobs lp;
      if (prow != nullptr) {
        ScoreRowOf(prow, backend_->VocabSize(), seq.tokens[next], seq.sampling.prompt_logprobs,
                   &lp);
      } else {
        lp = result.logprobs[row];
      }
      if (c.out.prompt_logprobs.empty()) c.out.prompt_logprobs_start = next;
      c.out.prompt_logprobs.push_back(ToLogprobEntry(lp, seq.tokens[next]));
      ++seq.prompt_logprobs_next;
    }
    const float* lrow = nullptr;
    if (s.wants_logits) {
      c.logprobs = result.logprobs[row];
      c.token = result.sampled[row++];
      if (c.token < 0) lrow = result.logits.data() + (full_row++) * backend_->VocabSize();
    }
    if (std::find(cancels.begin(), cancels.end(), s.seq->id) != cancels.end()) {
      // Cancelled after the step was launched: its token is dropped, as if the cancel had come
      // first (ApplyCancels ends the sequence next).
      if (s.wants_logits) {
        s.seq->tokens.pop_back();
        s.seq->last_token_in_flight = false;
      }
      if (c.out.started) outputs->push_back(std::move(c.out));
      continue;
    }
    CollectRow(s, lrow, &c);
    rows->push_back(std::move(c));
  }
  ++steps_;
  ReleaseDropped();
}

void EngineImpl::ReleaseDropped() {
  dropped_ids_.clear();
  std::vector<uint64_t> ids;
  ids.swap(retire_later_);
  for (uint64_t id : ids) Retire(id);
}

bool EngineImpl::Speculate(const Prepared& p) {
  if (!p.batch.penalty_tokens.empty() || (host_ != nullptr && host_->HasCopies())) {
    return ++speculation_declined_[0], false;
  }
  // Before the backend may start it: a block it reuses may still be read by an ahead copy.
  if (!OrderReuse().ok()) return ++speculation_declined_[0], false;
  for (const ScheduledSeq& s : p.plan.scheduled) {
    if (s.prompt_rows > 0) return ++speculation_declined_[1], false;
  }
  // The logits row of each sequence's sampled token in the step in flight.
  std::unordered_map<const Sequence*, int32_t> row_of;
  int32_t row = 0;
  for (const ScheduledSeq& s : inflight_->scheduled) {
    row += s.prompt_rows;
    if (s.wants_logits) row_of[s.seq] = row++;
  }
  std::vector<int32_t> feed(p.batch.token_ids.size(), -1);
  for (const Scheduler::PendingInput& in : p.pending) {
    const auto it = row_of.find(in.seq);
    // (Only the token the step in flight samples is pending: the last of the sequence's tokens.)
    if (it == row_of.end() || in.position + 1 != static_cast<int64_t>(in.seq->tokens.size())) {
      return ++speculation_declined_[2], false;
    }
    feed[in.index] = it->second;
  }
  return backend_->PrepareSampled(p.batch, feed);
}

void EngineImpl::PruneFinished(const std::vector<uint64_t>& cancels) {
  Prepared& p = *prepared_;
  if (p.speculated) {
    // The backend runs this batch already: the rows of sequences that ended stay, dropped.
    for (ScheduledSeq& s : p.plan.scheduled) {
      if (s.seq->state != SeqState::kRunning ||
          std::find(cancels.begin(), cancels.end(), s.seq->id) != cancels.end()) {
        s.dropped = true;
        dropped_ids_.push_back(s.seq->id);
        ++speculated_rows_dropped_;
      }
    }
    return;
  }
  const size_t before = p.plan.scheduled.size();
  std::erase_if(p.plan.scheduled, [&](const ScheduledSeq& s) {
    return s.seq->state != SeqState::kRunning ||
           std::find(cancels.begin(), cancels.end(), s.seq->id) != cancels.end();
  });
  if (p.plan.scheduled.size() != before) {
    // Rare (a stop token or a cancel): build the batch again; every input is known now.
    scheduler_.BuildBatch(p.plan, backend_->BlockSize(), &p.batch, &p.pending);
  }
}

void EngineImpl::FinishRows(std::vector<CollectedRow>* rows, std::vector<SequenceOutput>* outputs) {
  std::vector<uint64_t> done;
  outputs->reserve(outputs->size() + rows->size());
  for (CollectedRow& c : *rows) {
    // A sequence may have ended since Collect (the next step failed to launch): its outputs
    // still go first, then that step's error.
    auto it = seqs_.find(c.out.seq_id);
    Sequence* live = it != seqs_.end() ? it->second.get() : nullptr;
    if (!c.finished && live != nullptr && live->state == SeqState::kRunning) {
      Sequence& seq = *live;
      CommitBlocks(seq);
      if (c.was_prefill) ApplyHints(seq);
      {
        MutexLock lock(&mu_);
        residency_.Update(seq);
      }
      if (seq.pin_ttl_ms > 0 && !seq.pinned && seq.num_computed >= seq.prompt_len && c.token >= 0) {
        TakePins(seq);
      }
    }
    if (c.has_logprobs) c.out.logprobs.push_back(ToLogprobEntry(c.logprobs, c.token));
    SequenceOutput& out = c.out;
    if (out.started || out.finished || !out.new_tokens.empty() || !out.prompt_logprobs.empty()) {
      if (out.finished) done.push_back(out.seq_id);
      outputs->push_back(std::move(out));
    }
  }
  rows->clear();
  for (uint64_t id : done) Retire(id);
}

void EngineImpl::FailScheduled(const SchedulerOutput& plan, const absl::Status& st,
                               std::vector<SequenceOutput>* outputs) {
  // The step's sequences end with kError; the engine stays usable. A backend that ran out of
  // memory keeps its code (another worker may have room); anything else is the worker's fault.
  const absl::Status status =
      st.code() == absl::StatusCode::kResourceExhausted ? st : absl::InternalError(st.ToString());
  for (const ScheduledSeq& s : plan.scheduled) {
    if (s.dropped) continue;  // ended before (ScheduledSeq::dropped)
    const uint64_t id = s.seq->id;
    SequenceOutput out;
    out.seq_id = id;
    out.status = status;
    Finish(*s.seq, FinishReason::kError, out);
    outputs->push_back(std::move(out));
    Retire(id);
  }
}

void EngineImpl::Started(Sequence& seq, SequenceOutput& out) {
  seq.started = true;
  out.started = true;
  out.cached_tokens = seq.cached_tokens;
  out.prompt_tokens = seq.prompt_len;
  for (size_t i = 0; i < seq.chunks.size(); ++i) {
    const hash::PlacedChunk& c = seq.chunks[i];
    const int64_t cached = std::clamp<int64_t>(seq.cached_tokens - c.start, 0, c.end - c.start);
    out.chunks.push_back({c.hash, c.start, c.end, cached, seq.chunk_kinds[i]});
  }
}

void EngineImpl::EndStep() {
  // Copies decided in a step that ended up running nothing (everything preempted) still go now.
  FlushHostCopies().IgnoreError();  // a failure is counted and its keys dropped inside
  if (!failed_restores_.empty()) {
    // Their sequences failed with the step and released them; drop the keys.
    blocks_.EvictKeys(failed_restores_);
    failed_restores_.clear();
  }
  MutexLock lock(&mu_);
  // A chunk is held while its blocks are in either tier: report keys that left the last one,
  // and the tier of those that moved.
  std::vector<hash::Hash128> gone, to_host;
  for (const hash::Hash128& k : blocks_.TakeEvictedKeys()) {
    (host_ != nullptr && host_->Contains(k) ? to_host : gone).push_back(k);
  }
  residency_.OnTier(to_host, KvTier::kHost);
  residency_.OnTier(restored_, KvTier::kGpu);
  restored_.clear();
  if (host_ != nullptr) {
    for (const hash::Hash128& k : host_->TakeEvictedKeys()) {
      if (!blocks_.IsCachedKey(k)) gone.push_back(k);
    }
  }
  residency_.OnEvicted(gone);
  PublishStats();
}

}  // namespace

std::unique_ptr<Engine> NewEngine(const EngineOptions& options, std::unique_ptr<Backend> backend) {
  return std::make_unique<EngineImpl>(options, std::move(backend));
}

}  // namespace cascade::engine
