// The backend API's shared code: the ForwardBatch validator every backend runs, and the default
// ForwardSampled (whole logits from Forward, device-sampled rows drawn on the host with the same
// rule the GPU uses).
#include "gpu_worker/engine/backend.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpu_worker/engine/row_sampler.h"

namespace cascade::engine {
namespace {

absl::Status Bad(const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: ", msg));
}

// The first i in [0, n) where ids t[0, n) stop ascending strictly (t[i] <= t[i - 1]), a count
// c[i] is below `least` or a bias (where not null) is not finite; -1 where none. Every step
// carries these for every row with entries (tens of thousands at large batches): branch-free
// passes in blocks of 16 that the compiler turns into vector compares (kept out of line: inlined
// into the batch check, GCC left them scalar), the offender looked for only when there is one.
[[gnu::noinline]] int32_t FirstBadEntry(const int32_t* t, const int32_t* c, const float* bias,
                                        int32_t n, int32_t least) {
  int32_t bad = 0;
  int32_t i0 = 0;
  for (; i0 + 16 <= n - 1; i0 += 16) {  // t[i0 + 1 ..] > t[i0 ..]
    int32_t block = 0;
    for (int32_t j = 0; j < 16; ++j) block |= t[i0 + j + 1] <= t[i0 + j];
    bad |= block;
  }
  for (; i0 < n - 1; ++i0) bad |= t[i0 + 1] <= t[i0];
  for (i0 = 0; i0 + 16 <= n; i0 += 16) {
    int32_t block = 0;
    for (int32_t j = 0; j < 16; ++j) block |= c[i0 + j] < least;
    bad |= block;
  }
  for (; i0 < n; ++i0) bad |= c[i0] < least;
  for (int32_t i = 0; bias != nullptr && i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &bias[i], 4);
    bad |= (bits & 0x7f800000u) == 0x7f800000u && bits != 0xff800000u;  // +inf or NaN
  }
  for (int32_t i = 0; bad != 0 && i < n; ++i) {
    if ((i > 0 && t[i] <= t[i - 1]) || c[i] < least ||
        (bias != nullptr && !std::isfinite(bias[i]) && bias[i] != -INFINITY)) {
      return i;
    }
  }
  return -1;
}

// A SampleSpec within the ranges the kernels rely on (ValidateSampling's, plus the penalty range:
// a row with entries has its tokens ascending with counts >= 0 (>= -1 where biased), which the
// kernel's rank lookup needs, and biases finite or -inf (min_tokens' ban: penalty_list.h)).
absl::Status CheckSpec(const SampleSpec& s, const ForwardBatch& b, int vocab) {
  const size_t num_penalty_tokens = b.penalty_tokens.size();
  if (!(s.temperature >= 0.0f && std::isfinite(s.temperature)) ||
      !(s.top_p > 0.0f && s.top_p <= 1.0f) || !(s.min_p >= 0.0f && s.min_p <= 1.0f) ||
      !(s.repetition_penalty > 0.0f && std::isfinite(s.repetition_penalty)) ||
      !(s.frequency_penalty >= -2.0f && s.frequency_penalty <= 2.0f) ||
      !(s.presence_penalty >= -2.0f && s.presence_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature ", s.temperature, ", top_p ", s.top_p, ", min_p ", s.min_p,
        ", repetition_penalty ", s.repetition_penalty, ", frequency_penalty ", s.frequency_penalty,
        " or presence_penalty ", s.presence_penalty, " out of range"));
  }
  if (s.logprobs < 0 || s.logprobs > kMaxLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs ", s.logprobs, " outside [0, ", kMaxLogprobs, "]"));
  }
  if (s.score_token < -1 || s.score_token >= vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("score_token ", s.score_token, " outside [-1, ", vocab, ")"));
  }
  if (s.penalty_start < 0 || s.penalty_count < 0 ||
      static_cast<size_t>(s.penalty_start) + static_cast<size_t>(s.penalty_count) >
          num_penalty_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("penalty tokens [", s.penalty_start, ", +",
                                                   s.penalty_count, ") outside penalty_tokens (",
                                                   num_penalty_tokens, ")"));
  }
  if (s.biased != 0 && s.biased != 1) {
    return absl::InvalidArgumentError(absl::StrCat("biased ", s.biased, " is neither 0 nor 1"));
  }
  if (UsesEntries(s) && s.penalty_count > 0) {
    if (b.penalty_counts.size() != num_penalty_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("frequency or presence penalty or logit bias without penalty_counts (",
                       b.penalty_counts.size(), " for ", num_penalty_tokens, " tokens)"));
    }
    if (UsesBias(s) && b.penalty_bias.size() != num_penalty_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("logit bias without penalty_bias (",
                                                     b.penalty_bias.size(), " for ",
                                                     num_penalty_tokens, " tokens)"));
    }
    // A count of -1 (a token listed for its bias alone) only in a biased row; biases finite or
    // -inf.
    const int32_t least = UsesBias(s) ? -1 : 0;
    const int32_t* t = b.penalty_tokens.data() + s.penalty_start;
    const int32_t* c = b.penalty_counts.data() + s.penalty_start;
    const float* bias = UsesBias(s) ? b.penalty_bias.data() + s.penalty_start : nullptr;
    if (const int32_t i = FirstBadEntry(t, c, bias, s.penalty_count, least); i >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("penalty tokens [", s.penalty_start, ", +", s.penalty_count,
                       ") must be ascending with counts >= ", least,
                       (bias != nullptr ? " and finite or -inf biases" : ""), " (at ",
                       s.penalty_start + i, ")"));
    }
  }
  return absl::OkStatus();
}

// True if `offsets` is [n + 1] non-decreasing from 0 to `total`.
bool ValidOffsets(const std::vector<int32_t>& offsets, size_t n, int64_t total) {
  if (offsets.size() != n + 1 || offsets[0] != 0 || offsets[n] != total) return false;
  for (size_t i = 0; i < n; ++i) {
    if (offsets[i] > offsets[i + 1]) return false;
  }
  return true;
}

}  // namespace

absl::Status ValidateForwardBatch(const ForwardBatch& b, const BatchLimits& limits) {
  const int64_t t = b.num_tokens();
  const size_t s = static_cast<size_t>(b.num_seqs());
  const int bs = limits.block_size;
  if (limits.max_num_tokens > 0 && t > limits.max_num_tokens) {
    return Bad(absl::StrCat(t, " tokens exceed max_num_tokens ", limits.max_num_tokens));
  }
  if (static_cast<int64_t>(b.positions.size()) != t ||
      static_cast<int64_t>(b.slot_mapping.size()) != t) {
    return Bad(absl::StrCat("positions (", b.positions.size(), ") and slot_mapping (",
                            b.slot_mapping.size(), ") must have num_tokens (", t, ") entries"));
  }
  if (!ValidOffsets(b.query_start, s, t)) {
    return Bad("query_start must be [num_seqs + 1] non-decreasing offsets from 0 to num_tokens");
  }
  if (!ValidOffsets(b.block_table_start, s, static_cast<int64_t>(b.block_ids.size()))) {
    return Bad("block_table_start must be [num_seqs + 1] non-decreasing offsets into block_ids");
  }
  for (size_t i = 0; i < b.block_ids.size(); ++i) {
    if (b.block_ids[i] < 0 || b.block_ids[i] >= limits.num_blocks) {
      return Bad(absl::StrCat("block_ids[", i, "] = ", b.block_ids[i], " outside [0, ",
                              limits.num_blocks, ")"));
    }
  }
  for (size_t q = 0; q < s; ++q) {
    const int64_t table_len = b.block_table_start[q + 1] - b.block_table_start[q];
    if (b.context_lens[q] < 0 || b.context_lens[q] > table_len * bs) {
      return Bad(absl::StrCat("context_lens[", q, "] = ", b.context_lens[q], " does not fit its ",
                              table_len, " blocks"));
    }
    for (int32_t r = b.query_start[q]; r < b.query_start[q + 1]; ++r) {
      const int32_t pos = b.positions[r];
      if (b.token_ids[r] < 0 || b.token_ids[r] >= limits.vocab_size) {
        return Bad(absl::StrCat("token_ids[", r, "] = ", b.token_ids[r], " outside [0, ",
                                limits.vocab_size, ")"));
      }
      if (pos < 0 || pos >= b.context_lens[q]) {
        return Bad(absl::StrCat("positions[", r, "] = ", pos, " outside [0, context_lens[", q,
                                "] = ", b.context_lens[q], ")"));
      }
      const int64_t slot = int64_t{b.block_ids[b.block_table_start[q] + pos / bs]} * bs + pos % bs;
      if (b.slot_mapping[r] != slot) {
        return Bad(absl::StrCat("slot_mapping[", r, "] = ", b.slot_mapping[r],
                                " but the block table puts position ", pos, " at slot ", slot));
      }
    }
  }
  for (size_t i = 0; i < b.logits_rows.size(); ++i) {
    if (b.logits_rows[i] < 0 || b.logits_rows[i] >= t ||
        (i > 0 && b.logits_rows[i] <= b.logits_rows[i - 1])) {
      return Bad(absl::StrCat("logits_rows must be ascending rows in [0, ", t, ")"));
    }
  }
  if (!b.row_samples.empty() && b.row_samples.size() != b.logits_rows.size()) {
    return Bad(absl::StrCat("row_samples (", b.row_samples.size(),
                            ") must be empty or one per logits row (", b.logits_rows.size(), ")"));
  }
  if (!b.penalty_counts.empty() && b.penalty_counts.size() != b.penalty_tokens.size()) {
    return Bad(absl::StrCat("penalty_counts (", b.penalty_counts.size(),
                            ") must be empty or parallel to penalty_tokens (",
                            b.penalty_tokens.size(), ")"));
  }
  if (!b.penalty_bias.empty() && b.penalty_bias.size() != b.penalty_tokens.size()) {
    return Bad(absl::StrCat("penalty_bias (", b.penalty_bias.size(),
                            ") must be empty or parallel to penalty_tokens (",
                            b.penalty_tokens.size(), ")"));
  }
  for (size_t i = 0; i < b.row_samples.size(); ++i) {
    if (absl::Status s = CheckSpec(b.row_samples[i].spec, b, limits.vocab_size); !s.ok()) {
      return Bad(absl::StrCat("row_samples[", i, "]: ", s.message()));
    }
  }
  // Every step carries every penalized row's tokens (tens of thousands at large batches): one
  // branch-free pass over them in blocks of 16 (which the compiler turns into vector compares;
  // negative ids wrap above the limit), the offender looked for only when there is one.
  const int32_t* pt = b.penalty_tokens.data();
  const size_t np = b.penalty_tokens.size();
  const uint32_t limit = static_cast<uint32_t>(std::min<int64_t>(limits.vocab_size, INT32_MAX));
  uint32_t out = 0;
  size_t i0 = 0;
  for (; i0 + 16 <= np; i0 += 16) {
    uint32_t block = 0;
    for (size_t j = 0; j < 16; ++j) block |= static_cast<uint32_t>(pt[i0 + j]) >= limit;
    out |= block;
  }
  for (; i0 < np; ++i0) out |= static_cast<uint32_t>(pt[i0]) >= limit;
  if (out != 0) {
    for (size_t i = 0; i < b.penalty_tokens.size(); ++i) {
      if (b.penalty_tokens[i] < 0 || b.penalty_tokens[i] >= limits.vocab_size) {
        return Bad(absl::StrCat("penalty_tokens[", i, "] = ", b.penalty_tokens[i], " outside [0, ",
                                limits.vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Backend::ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                                     std::vector<int32_t>* tokens,
                                     std::vector<RowLogprobs>* logprobs) {
  std::vector<float> all;
  if (absl::Status s = Forward(batch, &all); !s.ok()) return s;
  const size_t vocab = static_cast<size_t>(VocabSize());
  const size_t rows = batch.logits_rows.size();
  tokens->assign(rows, -1);
  if (logprobs != nullptr) logprobs->assign(rows, RowLogprobs{});
  logits->clear();
  for (size_t r = 0; r < rows; ++r) {
    const float* row = all.data() + r * vocab;
    if (!batch.row_samples.empty() && batch.row_samples[r].on_device) {
      const SampleSpec& spec = batch.row_samples[r].spec;
      RowLogprobs scratch;
      const size_t n = static_cast<size_t>(spec.penalty_count);
      (*tokens)[r] = SampleRowRule(
          row, static_cast<int>(vocab), spec,
          std::span<const int32_t>(batch.penalty_tokens.data() + spec.penalty_start, n),
          batch.penalty_counts.empty()
              ? std::span<const int32_t>()
              : std::span<const int32_t>(batch.penalty_counts.data() + spec.penalty_start, n),
          batch.penalty_bias.empty()
              ? std::span<const float>()
              : std::span<const float>(batch.penalty_bias.data() + spec.penalty_start, n),
          logprobs != nullptr ? &(*logprobs)[r] : &scratch);
    } else {
      logits->insert(logits->end(), row, row + vocab);
    }
  }
  return absl::OkStatus();
}

}  // namespace cascade::engine

namespace cascade::engine {

absl::StatusOr<HostKvMemory> Backend::AllocateHostKv(size_t bytes) {
  if (KvBlockBytes() == 0) {
    return absl::UnimplementedError(absl::StrCat(Name(), " backend has no KV block I/O"));
  }
  // Page-aligned, untouched until used: a large pool costs address space, not resident memory.
  constexpr size_t kAlign = 4096;
  void* p =
      std::aligned_alloc(kAlign, std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host KV memory"));
  }
  return HostKvMemory(static_cast<std::byte*>(p), HostKvDeleter{&std::free});
}

absl::Status Backend::CopyBlocksToHost(std::span<const BlockCopy> copies) {
  if (copies.empty()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(Name(), " backend has no KV block I/O"));
}

absl::Status Backend::CopyBlocksFromHost(std::span<const BlockCopy> copies) {
  if (copies.empty()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(Name(), " backend has no KV block I/O"));
}

absl::StatusOr<uint64_t> Backend::CopyBlocksToHostAhead(std::span<const BlockCopy> copies) {
  if (absl::Status st = CopyBlocksToHost(copies); !st.ok()) return st;
  return ++ahead_tickets_;
}

absl::Status ValidateBlockCopies(std::span<const BlockCopy> copies, int64_t num_blocks) {
  for (size_t i = 0; i < copies.size(); ++i) {
    if (copies[i].block < 0 || copies[i].block >= num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("block copy ", i, ": block ", copies[i].block,
                                                     " outside [0, ", num_blocks, ")"));
    }
    if (copies[i].host == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("block copy ", i, ": null host pointer"));
    }
  }
  return absl::OkStatus();
}

bool SameBatchButFed(const ForwardBatch& a, const ForwardBatch& b, std::span<const int32_t> feed) {
  if (a.token_ids.size() != b.token_ids.size() || feed.size() != a.token_ids.size()) return false;
  for (size_t i = 0; i < feed.size(); ++i) {
    if (feed[i] < 0 && a.token_ids[i] != b.token_ids[i]) return false;
  }
  if (a.row_samples.size() != b.row_samples.size()) return false;
  for (size_t i = 0; i < a.row_samples.size(); ++i) {
    // (SampleSpec is 64 bytes of plain fields, no padding.)
    if (a.row_samples[i].on_device != b.row_samples[i].on_device ||
        std::memcmp(&a.row_samples[i].spec, &b.row_samples[i].spec, sizeof(SampleSpec)) != 0) {
      return false;
    }
  }
  return a.positions == b.positions && a.slot_mapping == b.slot_mapping &&
         a.query_start == b.query_start && a.context_lens == b.context_lens &&
         a.block_table_start == b.block_table_start && a.block_ids == b.block_ids &&
         a.logits_rows == b.logits_rows && a.penalty_tokens == b.penalty_tokens &&
         a.penalty_counts == b.penalty_counts && a.penalty_bias == b.penalty_bias;
}

bool Backend::PrepareSampled(const ForwardBatch& next, std::span<const int32_t> feed) {
  if (!speculative_ || !launched_.active || started_.active || !launched_.status.ok() ||
      feed.size() != next.token_ids.size()) {
    return false;
  }
  started_batch_ = next;
  for (size_t i = 0; i < feed.size(); ++i) {
    if (feed[i] < 0) continue;
    if (static_cast<size_t>(feed[i]) >= launched_.tokens.size() || launched_.tokens[feed[i]] < 0) {
      return false;  // (a row the step in flight returns whole has no token to feed)
    }
    started_batch_.token_ids[i] = launched_.tokens[feed[i]];
  }
  started_feed_.assign(feed.begin(), feed.end());
  started_.active = true;
  started_.status =
      ForwardSampled(started_batch_, &started_.logits, &started_.tokens, &started_.logprobs);
  return true;
}

absl::Status Backend::LaunchSampled(const ForwardBatch& batch) {
  if (launched_.active) return absl::FailedPreconditionError("LaunchSampled: a step is in flight");
  if (started_.active) {
    started_.active = false;
    if (SameBatchButFed(batch, started_batch_, started_feed_)) {
      launched_ = std::move(started_);
      launched_.active = true;
      return absl::OkStatus();
    }
  }
  launched_.active = true;
  launched_.status =
      ForwardSampled(batch, &launched_.logits, &launched_.tokens, &launched_.logprobs);
  return absl::OkStatus();
}

absl::Status Backend::FinishSampled(std::vector<float>* logits, std::vector<int32_t>* tokens,
                                    std::vector<RowLogprobs>* logprobs) {
  if (!launched_.active) return absl::FailedPreconditionError("FinishSampled: nothing in flight");
  launched_.active = false;
  logits->swap(launched_.logits);
  tokens->swap(launched_.tokens);
  if (logprobs != nullptr) logprobs->swap(launched_.logprobs);
  return std::exchange(launched_.status, absl::OkStatus());
}

}  // namespace cascade::engine
