// The seam between the backend-neutral engine and a compute backend (CPU reference, CUDA).
// The scheduler plans a ForwardBatch on the host; a backend runs the model over it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/engine/sample_rule.h"

namespace cascade::engine {

// How a logits row may be sampled inside the backend. `on_device` rows need no logits on the
// host: the backend draws the token (and its logprobs) by sample_rule.h's rule from `spec`,
// whose penalty tokens are ForwardBatch::penalty_tokens[spec.penalty_start, +penalty_count).
// Other rows come back whole.
struct RowSample {
  bool on_device = false;
  SampleSpec spec;
};

// One forward step over several sequences, laid out back to back. Built by the scheduler;
// a backend reads it and never keeps pointers into it past Forward().
//
// Positions are global: a sequence whose first `start_pos` tokens are already in its KV cache
// (prefix-cache hit, earlier chunk of a chunked prefill, or earlier decode steps) sends its new
// tokens with positions start_pos, start_pos + 1, ... Query row r attends to the keys at logical
// positions [0, positions[r]] of its own sequence (the causal mask with offset), which live at
// block_ids[block_table_start[s] + p / block_size] * block_size + p % block_size.
struct ForwardBatch {
  std::vector<int32_t> token_ids;          // [num_tokens] input ids
  std::vector<int32_t> positions;          // [num_tokens] global position of each input token
  std::vector<int32_t> slot_mapping;       // [num_tokens] KV slot (block * block_size + offset)
                                           //   where the token's K/V are written
  std::vector<int32_t> query_start;        // [num_seqs + 1] offsets into token_ids
  std::vector<int32_t> context_lens;       // [num_seqs] KV length after this step
                                           //   (= last position + 1)
  std::vector<int32_t> block_table_start;  // [num_seqs + 1] offsets into block_ids
  std::vector<int32_t> block_ids;          // concatenated per-sequence block tables
  std::vector<int32_t> logits_rows;        // rows of token_ids whose logits are wanted, ascending
  std::vector<RowSample> row_samples;      // [logits_rows.size()] or empty: how each row may be
                                           //   sampled by the backend (see RowSample)
  std::vector<int32_t> penalty_tokens;     // concatenated: each penalized row's listed tokens
                                           //   (distinct; ascending where counted; see SampleSpec)
  std::vector<int32_t> penalty_counts;     // parallel to penalty_tokens, or empty when no row's
                                           //   listed tokens carry entries (UsesEntries); -1:
                                           //   listed for a logit bias alone
  std::vector<float> penalty_bias;         // parallel to penalty_tokens, or empty when no row
                                           //   is biased (UsesBias): each token's logit bias

  int num_seqs() const { return static_cast<int>(context_lens.size()); }
  int num_tokens() const { return static_cast<int>(token_ids.size()); }
};

// What a backend can take: ValidateForwardBatch checks a batch against these.
struct BatchLimits {
  int64_t vocab_size = 0;
  int64_t num_blocks = 0;      // KV cache blocks
  int block_size = 0;          // tokens per block
  int64_t max_num_tokens = 0;  // tokens per batch at most; 0 = no limit
};

// The one check of a ForwardBatch, run by every backend before it touches memory, so a malformed
// batch (a scheduler bug) becomes INVALID_ARGUMENT naming the broken rule instead of an
// out-of-bounds read or write. Rules: at most max_num_tokens tokens; positions and slot_mapping
// have num_tokens entries; query_start and block_table_start are [num_seqs + 1] non-decreasing
// offsets from 0 to num_tokens and to block_ids.size(); block ids in [0, num_blocks); each
// context_len fits its sequence's block table; token ids in [0, vocab_size); each position in
// [0, its sequence's context_len); slot_mapping equal to the slot the block table gives for the
// token's position; logits_rows ascending rows of the batch; row_samples empty or one per
// logits row.
absl::Status ValidateForwardBatch(const ForwardBatch& batch, const BatchLimits& limits);

// Host memory for KV blocks, from Backend::AllocateHostKv: page-locked on CUDA (so block copies
// are DMA), plain memory on the CPU. `release` frees it.
struct HostKvDeleter {
  void (*release)(void*) = nullptr;
  void operator()(std::byte* p) const {
    if (p != nullptr && release != nullptr) release(p);
  }
};
using HostKvMemory = std::unique_ptr<std::byte[], HostKvDeleter>;

// One whole KV block (every layer, K and V) copied between the cache and host memory:
// Backend::KvBlockBytes() bytes at `host`, in the backend's own layout (a host copy is read back
// only by a backend of the same kind and model shape).
struct BlockCopy {
  int32_t block = 0;          // KV cache block id
  std::byte* host = nullptr;  // KvBlockBytes() bytes
};

// A compute backend: owns the model weights and the paged KV cache.
// Thread safety: Forward() is called from one engine thread at a time.
class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda".
  virtual std::string Name() const = 0;
  // What fixes the bits of this backend's KV blocks beside the model, the tokens and their
  // positions: its name and the numerics settings that change them (CUDA: the pinned GEMM
  // algorithms, split-K, the attention fold order). Two workers may exchange KV blocks (peer
  // fetch) only when theirs are equal: a block computed under other numerics would make a request
  // served from it differ from the same request run cold. Fixed once the backend is built, so
  // callable from any thread (the registry agent registers it; FetchKv checks it on gRPC threads).
  virtual std::string KvNumerics() const { return Name(); }
  // KV cache capacity in blocks and tokens per block; fixed at construction.
  virtual int64_t NumBlocks() const = 0;
  virtual int BlockSize() const = 0;
  // Vocabulary size (columns of the logits).
  virtual int VocabSize() const = 0;

  // Runs the model over `batch`: writes each input token's K/V into its slot, then computes
  // attention over the cached and new keys. logits: resized to
  // [batch.logits_rows.size(), VocabSize()] float32, row-major.
  // Must be batch-invariant: a row's result depends only on its sequence's tokens and KV, never
  // on what else is in the batch (this makes cached and cold runs bitwise equal).
  virtual absl::Status Forward(const ForwardBatch& batch, std::vector<float>* logits) = 0;

  // Forward for sampling: for each logits row either its whole logits or, where
  // batch.row_samples says on_device, the sampled token id (a score row's: spec.score_token) and
  // (WantsLogprobs(spec)) its logprobs (see RowSample). logits: [number of whole rows, VocabSize()]
  // in row order; tokens: [logits_rows.size()], -1 for whole rows; logprobs: [logits_rows.size()]
  // (null: none wanted), set for on_device rows where WantsLogprobs(spec).
  // The default runs Forward and samples on the host (SampleRowRule); a GPU backend overrides it
  // so those rows never copy a vocabulary-sized row to the host.
  virtual absl::Status ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                                      std::vector<int32_t>* tokens,
                                      std::vector<RowLogprobs>* logprobs);

  // ForwardSampled in two halves, for the engine's overlapped schedule: LaunchSampled starts
  // the step and may return before the device has finished it; FinishSampled waits for it and
  // returns what ForwardSampled would have returned for that batch (same bits). One step at a
  // time: LaunchSampled, then FinishSampled, then the next LaunchSampled. Between the two the
  // caller may issue block copies (they run after the launched step, as if between it and the
  // next) but no Forward; `batch` need not outlive the launch. The default runs ForwardSampled
  // inside LaunchSampled and keeps its results.
  virtual absl::Status LaunchSampled(const ForwardBatch& batch);
  virtual absl::Status FinishSampled(std::vector<float>* logits, std::vector<int32_t>* tokens,
                                     std::vector<RowLogprobs>* logprobs);

  // Overlapped schedule, optional: `next` is the step the caller will launch after the one in
  // flight, built before that one was finished: where feed[i] >= 0, token_ids[i] stands for the
  // token the step in flight samples for its logits row feed[i]. A backend may start `next` now,
  // behind the step in flight, taking those tokens from that step's results on the device, and
  // returns whether it did. Then the caller's next LaunchSampled is that batch (its fed token ids
  // as given here or filled in: they are not read), whose rows of sequences that ended meanwhile
  // it ignores, and the backend adopts the step it started: same results as launching it then. A
  // LaunchSampled of another batch waits for the started step and drops it. The default starts
  // nothing unless set_speculative(true): it then runs `next` at once on the results the default
  // LaunchSampled kept (no overlap; what the contract means, for backends without a device).
  virtual bool PrepareSampled(const ForwardBatch& next, std::span<const int32_t> feed);

  // Block I/O for the host KV tier. KvBlockBytes() is the size of one block's host copy; 0 means
  // the backend has no block I/O (the default) and the host tier stays off.
  virtual int64_t KvBlockBytes() const { return 0; }

  // Host memory the block copies may use. ResourceExhausted when it cannot be had.
  virtual absl::StatusOr<HostKvMemory> AllocateHostKv(size_t bytes);

  // Copy whole blocks out of (ToHost) or into (FromHost) the KV cache. The copies may run
  // asynchronously, in the order they were issued, but as if between steps: they see every
  // Forward that returned before the call, and every later Forward runs after them. So a block
  // whose content went to the host may be rewritten by the next Forward, and a block filled from
  // the host may be read by it. Host memory must stay valid, and the host must not touch it,
  // until WaitBlockCopies() returns. INVALID_ARGUMENT for a block id out of range or a null
  // host pointer (nothing is copied then).
  virtual absl::Status CopyBlocksToHost(std::span<const BlockCopy> copies);
  virtual absl::Status CopyBlocksFromHost(std::span<const BlockCopy> copies);
  // Blocks until every copy issued so far has finished.
  virtual absl::Status WaitBlockCopies() { return absl::OkStatus(); }

  // Copies blocks out of the KV cache ahead of their eviction, in the background: like
  // CopyBlocksToHost (issued in the same order as the other copies, seeing every Forward issued
  // before the call), except that later Forwards do not wait for them. So the caller must not
  // rewrite such a block until the copy is done (ticket <= AheadCopiesDone()) or it has called
  // OrderAfterAheadCopies(ticket) before the Forward that rewrites it. Returns the copies'
  // ticket: 1, 2, ... in call order. The default copies with CopyBlocksToHost, whose copies
  // every later Forward waits for, so its tickets are done at once.
  virtual absl::StatusOr<uint64_t> CopyBlocksToHostAhead(std::span<const BlockCopy> copies);
  // The largest ticket such that it and every earlier one are done. Does not block.
  virtual uint64_t AheadCopiesDone() { return ahead_tickets_; }
  // Every Forward issued after this call runs after the copies of `ticket` (and those before it)
  // have finished; the host does not wait.
  virtual absl::Status OrderAfterAheadCopies(uint64_t ticket) { return absl::OkStatus(); }

 protected:
  void set_speculative(bool on) { speculative_ = on; }

 private:
  // The default LaunchSampled's results, until FinishSampled takes them.
  struct Launched {
    bool active = false;
    absl::Status status;
    std::vector<float> logits;
    std::vector<int32_t> tokens;
    std::vector<RowLogprobs> logprobs;
  };
  Launched launched_;
  // The default CopyBlocksToHostAhead's last ticket.
  uint64_t ahead_tickets_ = 0;
  // The default PrepareSampled's step (set_speculative), until LaunchSampled adopts or drops it.
  bool speculative_ = false;
  Launched started_;
  ForwardBatch started_batch_;
  std::vector<int32_t> started_feed_;
};

// Whether `a` is `b` but for the token ids at rows i with feed[i] >= 0 (PrepareSampled's check
// that a launch is the batch it started).
bool SameBatchButFed(const ForwardBatch& a, const ForwardBatch& b, std::span<const int32_t> feed);

// The check every backend's CopyBlocks* runs first: ids in [0, num_blocks), host pointers set.
absl::Status ValidateBlockCopies(std::span<const BlockCopy> copies, int64_t num_blocks);

}  // namespace cascade::engine
