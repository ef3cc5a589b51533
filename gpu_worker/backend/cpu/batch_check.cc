// ForwardBatch validation; see batch_check.h.
#include "gpu_worker/backend/cpu/batch_check.h"

#include "absl/strings/str_cat.h"

namespace cascade::cpu {
namespace {

absl::Status Bad(std::string msg) {
  return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: ", msg));
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

absl::Status CheckForwardBatch(const engine::ForwardBatch& b, int64_t vocab_size,
                               int64_t num_blocks, int block_size) {
  const int64_t t = b.num_tokens();
  const size_t s = static_cast<size_t>(b.num_seqs());
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
    if (b.block_ids[i] < 0 || b.block_ids[i] >= num_blocks) {
      return Bad(absl::StrCat("block_ids[", i, "] = ", b.block_ids[i], " outside [0, ",
                              num_blocks, ")"));
    }
  }
  for (size_t q = 0; q < s; ++q) {
    const int64_t table_len = b.block_table_start[q + 1] - b.block_table_start[q];
    if (b.context_lens[q] < 0 || b.context_lens[q] > table_len * block_size) {
      return Bad(absl::StrCat("context_lens[", q, "] = ", b.context_lens[q],
                              " does not fit its ", table_len, " blocks"));
    }
    for (int32_t r = b.query_start[q]; r < b.query_start[q + 1]; ++r) {
      const int32_t pos = b.positions[r];
      if (b.token_ids[r] < 0 || b.token_ids[r] >= vocab_size) {
        return Bad(absl::StrCat("token_ids[", r, "] = ", b.token_ids[r], " outside [0, ",
                                vocab_size, ")"));
      }
      if (pos < 0 || pos >= b.context_lens[q]) {
        return Bad(absl::StrCat("positions[", r, "] = ", pos, " outside [0, context_lens[", q,
                                "] = ", b.context_lens[q], ")"));
      }
      const int64_t slot =
          int64_t{b.block_ids[b.block_table_start[q] + pos / block_size]} * block_size +
          pos % block_size;
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
  return absl::OkStatus();
}

}  // namespace cascade::cpu
