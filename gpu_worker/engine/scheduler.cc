// Scheduling policy: running sequences first (oldest first), then waiting ones in FIFO order.
// When a running sequence needs a block and none is left, the newest running sequence is
// preempted (its blocks freed, its tokens kept for recompute); its output does not change,
// because the backend is batch-invariant and recompute produces the same K/V.
#include "gpu_worker/engine/scheduler.h"

#include <algorithm>
#include <bit>

#include "gpu_worker/engine/penalty_list.h"
#include "gpu_worker/engine/sampler.h"

namespace cascade::engine {

Scheduler::Scheduler(const SchedulerOptions& options, BlockManager* blocks, HostKvTier* host)
    : options_(options), blocks_(blocks), host_(host), capture_logits_(options.capture_logits) {}

void Scheduler::AddWaiting(Sequence* seq) {
  seq->state = SeqState::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::FreeBlocks(Sequence* seq) {
  // Last-first, so descendants are evicted before their ancestors (BlockManager invariant).
  for (auto it = seq->block_table.rbegin(); it != seq->block_table.rend(); ++it) {
    blocks_->Release(*it);
  }
  seq->block_table.clear();
  seq->num_computed = 0;
  seq->num_committed = 0;
  seq->inflight_tokens = 0;
}

void Scheduler::Remove(Sequence* seq) {
  FreeBlocks(seq);
  std::erase(running_, seq);
  std::erase(waiting_, seq);
  seq->state = SeqState::kFinished;
}

void Scheduler::Preempt(Sequence* seq) {
  FreeBlocks(seq);
  std::erase(running_, seq);
  seq->state = SeqState::kWaiting;
  waiting_.push_front(seq);
  ++preemptions_;
}

bool Scheduler::EnsureBlocks(Sequence* seq, int64_t num_tokens) {
  const int bs = blocks_->block_size();
  const int64_t need = (num_tokens + bs - 1) / bs;
  while (static_cast<int64_t>(seq->block_table.size()) < need) {
    int32_t b = blocks_->AllocateFresh();
    if (b < 0) return false;
    seq->block_table.push_back(b);
  }
  return true;
}

int64_t Scheduler::CachedPrefix(const Sequence& seq, std::vector<bool>* on_host) const {
  on_host->clear();
  if (!options_.enable_prefix_cache) return 0;
  // At least the last token is computed: its logits pick the next token. So a prompt that is
  // entirely cached still recomputes its last block's tail.
  int64_t max_hit_blocks = (static_cast<int64_t>(seq.tokens.size()) - 1) / blocks_->block_size();
  // Prompt logprobs are computed, not cached: hits end before the first row still wanted.
  if (seq.WantsPromptRows()) {
    max_hit_blocks =
        std::min(max_hit_blocks, (seq.prompt_logprobs_next - 1) / blocks_->block_size());
  }
  const int64_t known = std::min<int64_t>(max_hit_blocks, seq.block_keys.size());
  for (int64_t j = 0; j < known; ++j) {
    const hash::Hash128& k = seq.block_keys[j];
    if (blocks_->IsCachedKey(k)) {
      on_host->push_back(false);
    } else if (host_ != nullptr && host_->Contains(k)) {
      on_host->push_back(true);
    } else {
      break;
    }
  }
  return known;
}

bool Scheduler::WaitsForRunningPrefix(Sequence* seq) {
  if (seq->prefix_waits >= options_.max_prefix_waits) return false;
  std::vector<bool> on_host;
  const int64_t known = CachedPrefix(*seq, &on_host);
  const int64_t j = static_cast<int64_t>(on_host.size());
  if (j >= known) return false;  // nothing more to hit
  const hash::Hash128& key = seq->block_keys[j];
  for (const Sequence* r : running_) {
    // Block j of a running sequence with the same chained key at j, not committed yet: the
    // same prefix, being computed (it commits once the step that fills it ends).
    if (r->num_committed <= j && static_cast<int64_t>(r->block_keys.size()) > j &&
        r->block_keys[j] == key) {
      ++seq->prefix_waits;
      return true;
    }
  }
  return false;
}

int64_t Scheduler::TakePromptRows(const Sequence& seq, int64_t from, int64_t n, int64_t* rows_left,
                                  ScheduledSeq* out) {
  out->prompt_rows = 0;
  if (!seq.WantsPromptRows()) return n;
  // Rows at positions [first, prompt_len - 1) of the step's [from, from + n).
  const int64_t first = std::max(from, seq.prompt_logprobs_next - 1);
  const int64_t end = seq.prompt_len - 1;
  if (first >= end) return n;
  // Tokens before `first` (recomputed after a preemption) need no rows.
  const int64_t free_tokens = first - from;
  if (n > free_tokens + *rows_left) n = free_tokens + *rows_left;
  const int64_t rows = std::max<int64_t>(0, std::min(from + n, end) - first);
  *rows_left -= rows;
  out->prompt_row_first = first;
  out->prompt_rows = static_cast<int32_t>(rows);
  return n;
}

bool Scheduler::Admit(Sequence* seq, int64_t budget, int64_t* rows_left, ScheduledSeq* out) {
  const int bs = blocks_->block_size();
  const int64_t len = static_cast<int64_t>(seq->tokens.size());
  // The cached prefix: each leading block on the GPU, or else on the host (restored into a fresh
  // block), up to the first block in neither.
  std::vector<bool> on_host;
  CachedPrefix(*seq, &on_host);
  const int64_t hit = static_cast<int64_t>(on_host.size());
  int64_t rows = *rows_left;
  const int64_t n = TakePromptRows(*seq, hit * bs, std::min(len - hit * bs, budget), &rows, out);
  if (n <= 0) return false;
  const int64_t need_total = (hit * bs + n + bs - 1) / bs;
  // Hits sitting unreferenced in the GPU cache stop being available once acquired.
  int64_t gpu_hits = 0, hits_unreferenced = 0;
  for (int64_t j = 0; j < hit; ++j) {
    if (on_host[j]) continue;
    ++gpu_hits;
    if (blocks_->RefCount(*blocks_->Lookup(seq->block_keys[j])) == 0) ++hits_unreferenced;
  }
  if (blocks_->NumAvailable() - hits_unreferenced < need_total - gpu_hits) return false;

  // GPU hits first (so restoring cannot evict them), then a fresh block per host hit, whose
  // allocation may offload other blocks to the host: the copies to restore are protected.
  seq->block_table.assign(hit, -1);
  for (int64_t j = 0; j < hit; ++j) {
    if (!on_host[j]) seq->block_table[j] = blocks_->AcquireCached(seq->block_keys[j]);
  }
  if (gpu_hits < hit) host_->Protect(std::span(seq->block_keys.data(), hit));
  for (int64_t j = 0; j < hit; ++j) {
    if (!on_host[j]) continue;
    const int32_t b = blocks_->AllocateFresh();  // cannot fail: checked above
    seq->block_table[j] = b;
    blocks_->RaiseHints(b, host_->Restore(seq->block_keys[j], b));
    blocks_->Commit(b, seq->block_keys[j], j == 0 ? hash::Hash128{} : seq->block_keys[j - 1]);
    blocks_->NoteUse(b);  // (wanted again: a hit, from the host)
  }
  if (gpu_hits < hit) host_->Unprotect();
  seq->num_computed = hit * bs;
  seq->num_committed = hit;
  if (!seq->started) {
    prefix_queries_ += len;
    prefix_hits_ += hit * bs;
    prefix_hits_host_ += (hit - gpu_hits) * bs;
    seq->cached_tokens = hit * bs;
  }
  EnsureBlocks(seq, hit * bs + n);  // cannot fail: checked above
  seq->state = SeqState::kRunning;
  running_.push_back(seq);
  out->seq = seq;
  out->num_tokens = n;
  out->wants_logits = hit * bs + n == len;
  out->newly_admitted = !seq->started;
  *rows_left = rows;
  return true;
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int64_t budget = options_.max_num_batched_tokens;
  int64_t prompt_rows_left = options_.max_prompt_logprob_rows;

  std::vector<Sequence*> order = running_;
  for (Sequence* seq : order) {
    if (budget <= 0) break;
    if (seq->state != SeqState::kRunning) continue;  // preempted earlier in this loop
    if (seq->last_token_in_flight) continue;         // the step in flight ends it
    ScheduledSeq s{seq};
    int64_t rows_left = prompt_rows_left;
    const int64_t n =
        TakePromptRows(*seq, seq->num_computed, std::min(seq->pending(), budget), &rows_left, &s);
    if (n <= 0) continue;
    bool ok = EnsureBlocks(seq, seq->num_computed + n);
    while (!ok) {
      Sequence* victim = running_.back();
      Preempt(victim);
      out.preempted.push_back(victim);
      if (victim == seq) break;
      ok = EnsureBlocks(seq, seq->num_computed + n);
    }
    if (!ok) continue;
    s.num_tokens = n;
    s.wants_logits = seq->num_computed + n == static_cast<int64_t>(seq->tokens.size());
    out.scheduled.push_back(s);
    prompt_rows_left = rows_left;
    budget -= n;
  }
  // A step that had to preempt admits nothing new: memory is the bottleneck.
  if (!out.preempted.empty()) {
    std::erase_if(out.scheduled,
                  [](const ScheduledSeq& s) { return s.seq->state != SeqState::kRunning; });
    return out;
  }
  for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0 &&
                                   static_cast<int>(running_.size()) < options_.max_num_seqs;) {
    Sequence* seq = *it;
    // One waiting for a running sequence's prefix keeps its place (a step or two: a burst on a
    // new prefix then prefills it once, not once a request admitted together); the ones behind
    // it go ahead meanwhile. Otherwise FIFO: one that does not fit stops admission.
    if (WaitsForRunningPrefix(seq)) {
      ++it;
      continue;
    }
    ScheduledSeq s;
    if (!Admit(seq, budget, &prompt_rows_left, &s)) break;
    it = waiting_.erase(it);
    out.scheduled.push_back(s);
    budget -= s.num_tokens;
  }
  return out;
}

namespace {

// Empties every field of a batch, keeping its vectors' capacity: a step's lists (hundreds of KB
// with penalties at large batches) then reuse last step's memory instead of a malloc and free
// per vector per step (which at the heap's top also return pages to the OS and fault them back).
void ClearKeepingCapacity(ForwardBatch* b) {
  static_assert(sizeof(ForwardBatch) == 12 * sizeof(std::vector<int32_t>),
                "ForwardBatch has a new field: clear it here too");
  b->token_ids.clear(), b->positions.clear(), b->slot_mapping.clear();
  b->query_start.clear(), b->context_lens.clear(), b->block_table_start.clear();
  b->block_ids.clear(), b->logits_rows.clear(), b->row_samples.clear();
  b->penalty_tokens.clear(), b->penalty_counts.clear(), b->penalty_bias.clear();
}

}  // namespace

void Scheduler::BuildBatch(const SchedulerOutput& out, int block_size, ForwardBatch* batch,
                           std::vector<PendingInput>* pending) const {
  ClearKeepingCapacity(batch);
  if (pending != nullptr) pending->clear();
  batch->query_start.push_back(0);
  batch->block_table_start.push_back(0);
  for (const ScheduledSeq& s : out.scheduled) {
    const Sequence& seq = *s.seq;
    for (int64_t p = seq.num_computed; p < seq.num_computed + s.num_tokens; ++p) {
      if (seq.tokens[p] == kPendingToken) {
        pending->push_back({batch->num_tokens(), s.seq, p});
      }
      batch->token_ids.push_back(seq.tokens[p]);
      batch->positions.push_back(static_cast<int32_t>(p));
      batch->slot_mapping.push_back(seq.block_table[p / block_size] * block_size +
                                    static_cast<int32_t>(p % block_size));
    }
    // Prompt-logprob rows: score rows (the row at position p scores the prompt's token p + 1, by
    // the backend: its logprobs and rank come back, not the row), or whole rows where tests
    // capture logits (the engine scores them by the same rule).
    const int32_t seq_first = batch->num_tokens() - static_cast<int32_t>(s.num_tokens);
    for (int32_t r = 0; r < s.prompt_rows; ++r) {
      batch->logits_rows.push_back(seq_first +
                                   static_cast<int32_t>(s.prompt_row_first - seq.num_computed) + r);
      SampleSpec score;
      score.logprobs = seq.sampling.prompt_logprobs;
      score.score_token = seq.tokens[s.prompt_row_first + r + 1];
      batch->row_samples.push_back(RowSample{!capture_logits_, score});
    }
    if (s.wants_logits) {
      batch->logits_rows.push_back(batch->num_tokens() - 1);
      // Every row is sampled by the backend (its rule is the host's, sample_rule.h), except
      // when tests capture logits: then rows come back whole and the engine samples them.
      batch->row_samples.push_back(
          RowSample{!capture_logits_,
                    SpecFor(seq.sampling, seq.seed, static_cast<int64_t>(seq.tokens.size()))});
    }
    batch->query_start.push_back(batch->num_tokens());
    batch->context_lens.push_back(static_cast<int32_t>(seq.num_computed + s.num_tokens));
    batch->block_ids.insert(batch->block_ids.end(), seq.block_table.begin(), seq.block_table.end());
    batch->block_table_start.push_back(static_cast<int32_t>(batch->block_ids.size()));
  }
  FillPenalties(out, batch);
}

namespace {

// f(seq, spec) for each sampled row with listed tokens (a penalty or a logit bias): the row's
// sequence and its SampleSpec (rows
// are batch.row_samples in plan order).
template <class F>
void ForEachPenalizedRow(const SchedulerOutput& out, ForwardBatch* batch, F&& f) {
  size_t row = 0;
  for (const ScheduledSeq& s : out.scheduled) {
    row += s.prompt_rows;  // (whole rows, never penalized)
    if (!s.wants_logits) continue;
    SampleSpec& spec = batch->row_samples[row++].spec;
    if (HasListed(s.seq->sampling)) f(*s.seq, spec);
  }
}

}  // namespace

void Scheduler::FillPenalties(const SchedulerOutput& out, ForwardBatch* batch) const {
  batch->penalty_tokens.clear();
  batch->penalty_counts.clear();
  batch->penalty_bias.clear();
  // One allocation, of a power-of-two size: the lists grow a little every step, and growing
  // allocations of hundreds of KB would each take fresh pages from the OS (malloc's mmap
  // threshold follows the last size freed), a page fault per 4 KB on every step.
  size_t total = 0;
  bool counts = false;  // some row's listed tokens carry entries: penalty_counts is parallel
  bool bias = false;    // some row is biased: penalty_bias is parallel
  ForEachPenalizedRow(out, batch, [&](const Sequence& seq, SampleSpec& spec) {
    total += seq.tokens.size() + seq.listed_tokens.size();  // >= its listed tokens and room
    counts |= UsesEntries(spec);
    bias |= UsesBias(spec);
  });
  if (total == 0) return;
  batch->penalty_tokens.reserve(std::bit_ceil(total));
  if (counts) batch->penalty_counts.reserve(std::bit_ceil(total));
  if (bias) batch->penalty_bias.reserve(std::bit_ceil(total));
  ForEachPenalizedRow(out, batch, [&](Sequence& seq, SampleSpec& spec) {
    AdvanceListed(&seq, [](int32_t, bool) {});
    spec.penalty_start = static_cast<int32_t>(batch->penalty_tokens.size());
    spec.penalty_count = static_cast<int32_t>(seq.listed_tokens.size());
    batch->penalty_tokens.insert(batch->penalty_tokens.end(), seq.listed_tokens.begin(),
                                 seq.listed_tokens.end());
    // Room for the tokens still in flight (0 is a valid token id; the count leaves it out).
    batch->penalty_tokens.resize(batch->penalty_tokens.size() +
                                 (seq.tokens.size() - seq.listed_upto));
    // The parallel arrays: the row's entries where it carries them, zeros where not (another
    // row does), and the same room.
    auto parallel = [&](auto* dst, bool carries, const auto& src) {
      if (carries) dst->insert(dst->end(), src.begin(), src.end());
      dst->resize(batch->penalty_tokens.size());
    };
    if (counts) parallel(&batch->penalty_counts, UsesEntries(spec), seq.listed_counts);
    if (bias) parallel(&batch->penalty_bias, UsesBias(spec), seq.listed_bias);
    if (Banning(seq, spec.position)) {  // min_tokens: the stop ids' biases -inf in this step's copy
      ApplyBan(seq.stop_ban, batch->penalty_tokens.data() + spec.penalty_start,
               batch->penalty_bias.data() + spec.penalty_start, spec.penalty_count);
    }
  });
}

void Scheduler::FillPending(const SchedulerOutput& out, const std::vector<PendingInput>& pending,
                            ForwardBatch* batch) const {
  if (pending.empty()) return;
  for (const PendingInput& p : pending) batch->token_ids[p.index] = p.seq->tokens[p.position];
  ForEachPenalizedRow(out, batch, [&](Sequence& seq, SampleSpec& spec) {
    // At most the room FillPenalties left (the tokens then in flight), into the row's list in
    // the batch as into the sequence's.
    int32_t* tokens = batch->penalty_tokens.data() + spec.penalty_start;
    int32_t* counts =
        UsesEntries(spec) ? batch->penalty_counts.data() + spec.penalty_start : nullptr;
    float* bias = UsesBias(spec) ? batch->penalty_bias.data() + spec.penalty_start : nullptr;
    AdvanceListed(&seq, [&](int32_t t, bool generated) {
      AddListed(tokens, counts, bias, &spec.penalty_count, t, generated);
    });
  });
}

}  // namespace cascade::engine
