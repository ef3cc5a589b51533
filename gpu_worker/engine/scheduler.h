// Continuous-batching scheduler: decides, each step, which sequences run how many tokens, under
// a token budget and a sequence cap, with chunked prefill, prefix-cache admission and
// preemption (free and recompute) when KV blocks run out.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "gpu_worker/engine/backend.h"
#include "gpu_worker/engine/block_manager.h"
#include "gpu_worker/engine/host_tier.h"
#include "gpu_worker/engine/sequence.h"

namespace cascade::engine {

struct SchedulerOptions {
  int max_num_seqs = 64;              // running sequences at most
  int max_num_batched_tokens = 2048;  // tokens per step at most (prefill chunks + decodes)
  bool enable_prefix_cache = true;
  // A waiting request whose next uncached block a running sequence is computing waits for it
  // (up to this many steps, keeping its place; those behind it go ahead) instead of computing
  // the same block again: it starts a step or two later with a hit. 0: never wait.
  int max_prefix_waits = 32;
  bool capture_logits = false;  // tests: every row needs its whole logits
  // Prompt-logprob rows (SamplingParams::prompt_logprobs) per step at most, so a long prompt's
  // rows come over several steps. Each is a score row: the backend returns its logprobs (~180
  // bytes), not the row, but computes the row (the CUDA backend 256 rows at a time; a backend
  // that scores on the host, the CPU one, holds the step's rows at vocabulary x 4 bytes each: the
  // worker asks 256 of it).
  // Measured on an H200 (qwen3-0.6b, bench/engine/RESULTS.md): 256 rows a step scored 59-89k
  // prompt tok/s, 4096 rows 161-220k (plain prefill 225-400k).
  int max_prompt_logprob_rows = 4096;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int64_t num_tokens = 0;     // tokens computed this step, from seq->num_computed
  bool wants_logits = false;  // the step reaches the end of the known tokens
  bool newly_admitted = false;
  bool was_prefill = false;  // set by the engine when the step is launched
  // Prompt-logprob rows: whole logits rows at positions [prompt_row_first, + prompt_rows), each
  // scoring the prompt token after it; in the batch before the sampled row.
  int64_t prompt_row_first = 0;
  int32_t prompt_rows = 0;
  // A step the backend started before the step in flight was collected (Backend::PrepareSampled):
  // the sequence ended (a stop token, a cancel) after this step was built; its row still runs
  // and its result is dropped.
  bool dropped = false;
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> scheduled;
  std::vector<Sequence*> preempted;  // sent back to waiting this step
};

// Not thread-safe: the engine's step thread owns it.
class Scheduler {
 public:
  // `host`: the host KV tier, or null when it is off. Admission restores leading blocks found
  // there (HostKvTier::Restore records the copies; the engine runs them before the step).
  Scheduler(const SchedulerOptions& options, BlockManager* blocks, HostKvTier* host = nullptr);

  void AddWaiting(Sequence* seq);
  // Removes a sequence from the queues and frees its blocks (finish, cancel, error).
  void Remove(Sequence* seq);

  SchedulerOutput Schedule();

  // Fills `batch` for the scheduled work; slots and block tables come from the sequences. Input
  // tokens still kPendingToken (a step in flight samples them) are left so and listed in
  // `pending` (batch.token_ids index, sequence, position); FillPending then puts in their values
  // once they are known. REQUIRES: pending != null if any is kPendingToken.
  struct PendingInput {
    int32_t index = 0;
    Sequence* seq = nullptr;
    int64_t position = 0;
  };
  void BuildBatch(const SchedulerOutput& out, int block_size, ForwardBatch* batch,
                  std::vector<PendingInput>* pending = nullptr) const;
  // Puts the now known tokens into the batch's inputs and adds them to their rows' penalty
  // lists (in the room BuildBatch left after each). REQUIRES: every listed
  // position's token is known.
  void FillPending(const SchedulerOutput& out, const std::vector<PendingInput>& pending,
                   ForwardBatch* batch) const;

  // REQUIRES: num_waiting() > 0.
  Sequence* waiting_front() const { return waiting_.front(); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int64_t preemptions() const { return preemptions_; }
  int64_t prefix_queries() const { return prefix_queries_; }
  int64_t prefix_hits() const { return prefix_hits_; }
  // Of prefix_hits(), the tokens restored from the host tier.
  int64_t prefix_hits_host() const { return prefix_hits_host_; }

 private:
  // Makes the block table cover `num_tokens` tokens; false if blocks ran out.
  bool EnsureBlocks(Sequence* seq, int64_t num_tokens);
  void FreeBlocks(Sequence* seq);
  void Preempt(Sequence* seq);
  // Sets each sampled row's penalty range (and batch.penalty_tokens / penalty_counts) from the
  // sequences' listed tokens, and leaves room after each for as many as the row has tokens still
  // in flight (FillPending adds them there: a step's penalty lists are not copied twice). Rows
  // are batch.row_samples in plan order.
  void FillPenalties(const SchedulerOutput& out, ForwardBatch* batch) const;
  // Admits the head of the waiting queue with at most `budget` tokens; false if it does not fit.
  // `rows_left`: the step's prompt-logprob rows still free (TakePromptRows).
  bool Admit(Sequence* seq, int64_t budget, int64_t* rows_left, ScheduledSeq* out);
  // Caps the step's `n` tokens of `seq` from position `from` by the step's prompt-logprob rows
  // left (taking them) and sets out's rows; returns the capped n (0: no row left for it).
  static int64_t TakePromptRows(const Sequence& seq, int64_t from, int64_t n, int64_t* rows_left,
                                ScheduledSeq* out);
  // The leading blocks of `seq` cached in either tier, as on_host[j] (false: on the GPU), up to
  // the first in neither; returns how many blocks could hit at most (the last token is always
  // computed). Empty without the prefix cache.
  int64_t CachedPrefix(const Sequence& seq, std::vector<bool>* on_host) const;
  // True when `seq` (waiting) should wait: its first block in neither cache tier is one a
  // running sequence has yet to commit (counts the wait; false past max_prefix_waits).
  bool WaitsForRunningPrefix(Sequence* seq);

  const SchedulerOptions options_;
  BlockManager* const blocks_;
  HostKvTier* const host_;
  const bool capture_logits_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // in admission order
  int64_t preemptions_ = 0;
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
  int64_t prefix_hits_host_ = 0;
};

}  // namespace cascade::engine
