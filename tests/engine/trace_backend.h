// A model-free backend for engine tests. Each KV slot records the (token, position) written to
// it; a query row's logits are a hash of every (token, position) it reads through its block
// table, over keys [0, position]. So, like a real model, a row's output is a function of its
// whole visible prefix, and any bookkeeping slip (wrong block, stale or overwritten slot, wrong
// position) changes the output or fails the step with a message saying which slot was wrong.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu_worker/engine/backend.h"

namespace cascade::engine::testing {

class TraceBackend final : public Backend {
 public:
  TraceBackend(int64_t num_blocks, int block_size, int vocab)
      : num_blocks_(num_blocks),
        block_size_(block_size),
        vocab_(vocab),
        kv_(num_blocks * block_size, Slot{-1, -1}) {}

  std::string Name() const override { return "trace"; }
  int64_t NumBlocks() const override { return num_blocks_; }
  int BlockSize() const override { return block_size_; }
  int VocabSize() const override { return vocab_; }

  absl::Status Forward(const ForwardBatch& b, std::vector<float>* logits) override {
    // Ahead copies the engine ordered this step after run first; the rest stay in flight.
    RunAheadCopies(ordered_);
    ++forward_calls_;
    max_batch_tokens_ = std::max<int64_t>(max_batch_tokens_, b.num_tokens());
    if (b.positions.size() != b.token_ids.size() || b.slot_mapping.size() != b.token_ids.size() ||
        b.query_start.size() != static_cast<size_t>(b.num_seqs() + 1) ||
        b.block_table_start.size() != static_cast<size_t>(b.num_seqs() + 1)) {
      return absl::InternalError("inconsistent batch sizes");
    }
    for (int r = 0; r < b.num_tokens(); ++r) {
      const int32_t slot = b.slot_mapping[r];
      if (slot < 0 || slot >= static_cast<int32_t>(kv_.size())) {
        return absl::InternalError(absl::StrCat("row ", r, " writes slot ", slot, " out of range"));
      }
      kv_[slot] = Slot{b.token_ids[r], b.positions[r]};
    }
    logits->assign(b.logits_rows.size() * vocab_, 0.0f);
    size_t out_row = 0;
    for (int s = 0; s < b.num_seqs(); ++s) {
      for (int r = b.query_start[s]; r < b.query_start[s + 1]; ++r) {
        const int32_t pos = b.positions[r];
        if (pos >= b.context_lens[s]) return absl::InternalError("position beyond context_len");
        uint64_t h = 0x12345678;
        for (int32_t p = 0; p <= pos; ++p) {
          const int32_t idx = b.block_table_start[s] + p / block_size_;
          if (idx >= b.block_table_start[s + 1]) {
            return absl::InternalError(absl::StrCat("seq ", s, " position ", p, " has no block"));
          }
          const Slot& e = kv_[b.block_ids[idx] * block_size_ + p % block_size_];
          if (e.position != p) {
            return absl::InternalError(absl::StrCat("seq ", s, " reads position ", p,
                                                    " from a slot holding position ", e.position));
          }
          h = Mix(h, static_cast<uint64_t>(e.token) * 1000003ULL + static_cast<uint64_t>(p));
        }
        if (out_row < b.logits_rows.size() && b.logits_rows[out_row] == r) {
          for (int v = 0; v < vocab_; ++v) {
            uint64_t x = Mix(h, static_cast<uint64_t>(v));
            (*logits)[out_row * vocab_ + v] =
                static_cast<float>((x >> 40) & 0xffffff) / 16777216.0f * 8.0f - 4.0f;
          }
          ++out_row;
        }
      }
    }
    if (out_row != b.logits_rows.size()) return absl::InternalError("logits_rows not ascending");
    // Ahead copies issued `ahead_lag_` Forwards ago finish now (as a copy stream would, later).
    uint64_t due = 0;
    for (const Ahead& a : ahead_) {
      if (forward_calls_ - a.issued_at >= ahead_lag_) due = a.ticket;
    }
    RunAheadCopies(due);
    return absl::OkStatus();
  }

  // Block I/O: a block's host copy is its slots' (token, position) pairs, so a block restored
  // from the wrong host copy fails the position check or changes the logits.
  int64_t KvBlockBytes() const override { return block_size_ * int64_t{sizeof(Slot)}; }
  absl::Status CopyBlocksToHost(std::span<const BlockCopy> copies) override {
    if (absl::Status s = ValidateBlockCopies(copies, num_blocks_); !s.ok()) return s;
    RunAheadCopies(UINT64_MAX);  // one copy stream: in issue order
    for (const BlockCopy& c : copies) {
      std::memcpy(c.host, kv_.data() + c.block * block_size_, KvBlockBytes());
    }
    blocks_to_host_ += static_cast<int64_t>(copies.size());
    return absl::OkStatus();
  }
  absl::Status CopyBlocksFromHost(std::span<const BlockCopy> copies) override {
    if (absl::Status s = ValidateBlockCopies(copies, num_blocks_); !s.ok()) return s;
    RunAheadCopies(UINT64_MAX);
    if (fail_restores_) return absl::DataLossError("injected: host copy failed");
    for (const BlockCopy& c : copies) {
      std::memcpy(kv_.data() + c.block * block_size_, c.host, KvBlockBytes());
    }
    blocks_from_host_ += static_cast<int64_t>(copies.size());
    return absl::OkStatus();
  }
  absl::Status WaitBlockCopies() override {
    RunAheadCopies(UINT64_MAX);
    return absl::OkStatus();
  }

  // Copies ahead of eviction, deferred as late as Backend's contract allows (set_ahead_lag): a
  // copy reads its block when it runs, so a block the engine rewrites before its ahead copy ran
  // (without OrderAfterAheadCopies) reaches the host with the wrong (token, position) pairs.
  absl::StatusOr<uint64_t> CopyBlocksToHostAhead(std::span<const BlockCopy> copies) override {
    if (absl::Status s = ValidateBlockCopies(copies, num_blocks_); !s.ok()) return s;
    ahead_.push_back({++ahead_issued_, forward_calls_, {copies.begin(), copies.end()}});
    return ahead_issued_;
  }
  uint64_t AheadCopiesDone() override { return ahead_done_; }
  absl::Status OrderAfterAheadCopies(uint64_t ticket) override {
    ordered_ = std::max(ordered_, ticket);
    ++orders_;
    return absl::OkStatus();
  }
  // Forwards after which an ahead copy runs on its own; INT64_MAX: only when something orders it.
  void set_ahead_lag(int64_t forwards) { ahead_lag_ = forwards; }
  int64_t ahead_orders() const { return orders_; }
  int64_t blocks_to_host_ahead() const { return blocks_to_host_ahead_; }

  // Fault injection: restores from the host fail (nothing is copied).
  void set_fail_restores(bool fail) { fail_restores_ = fail; }
  int64_t blocks_to_host() const { return blocks_to_host_; }
  int64_t blocks_from_host() const { return blocks_from_host_; }

  int64_t forward_calls() const { return forward_calls_; }
  int64_t max_batch_tokens() const { return max_batch_tokens_; }

 private:
  struct Slot {
    int32_t token;
    int32_t position;
  };
  static uint64_t Mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 33);
  }

  const int64_t num_blocks_;
  const int block_size_;
  const int vocab_;
  std::vector<Slot> kv_;
  int64_t forward_calls_ = 0;
  int64_t max_batch_tokens_ = 0;
  int64_t blocks_to_host_ = 0;
  int64_t blocks_from_host_ = 0;
  bool fail_restores_ = false;
  struct Ahead {
    uint64_t ticket;
    int64_t issued_at;  // forward_calls_ then
    std::vector<BlockCopy> copies;
  };
  // Runs the ahead copies in flight up to `ticket`, in order.
  void RunAheadCopies(uint64_t ticket) {
    while (!ahead_.empty() && ahead_.front().ticket <= ticket) {
      for (const BlockCopy& c : ahead_.front().copies) {
        std::memcpy(c.host, kv_.data() + c.block * block_size_, KvBlockBytes());
        ++blocks_to_host_ahead_;
      }
      ahead_done_ = ahead_.front().ticket;
      ahead_.erase(ahead_.begin());
    }
  }
  std::vector<Ahead> ahead_;
  uint64_t ahead_issued_ = 0, ahead_done_ = 0, ordered_ = 0;
  int64_t ahead_lag_ = 1, orders_ = 0, blocks_to_host_ahead_ = 0;
};

}  // namespace cascade::engine::testing
