// Internal: the byte-level alphabet (GPT-2's bytes_to_unicode) and the BPE model that merges a
// pre-tokenized piece's bytes by merge rank, with a word cache.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace cascade::tokenizer::internal {

// tokenizer.json spells vocab and merges in the byte-level alphabet: each byte is one code
// point, printable Latin-1 bytes as themselves, the rest shifted to U+0100 and up ("Ġ" is the
// space). These convert between that spelling and raw bytes; nullopt if `token` has a code
// point outside the alphabet.
std::optional<std::string> ByteLevelToBytes(std::string_view token);
std::string BytesToByteLevel(std::string_view bytes);

class BpeModel {
 public:
  // `vocab`: raw token bytes -> id. `merges`: pairs of raw token bytes, highest priority first.
  // Every single byte must be in the vocab (byte-level BPE never needs an unknown token), and
  // every merge's parts and result too. `ignore_merges`: a piece that is itself a vocab entry
  // is taken whole (HF `ignore_merges`).
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      absl::flat_hash_map<std::string, int32_t> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges);

  // Appends the ids of one pre-tokenized piece (raw bytes). Thread-safe.
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  BpeModel() = default;
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // O(n log n) in the piece's bytes: a heap of candidate pairs ordered by (rank, position).
  void MergeWord(std::string_view word, std::vector<int32_t>* out) const;

  // Set at construction.
  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  int32_t byte_ids_[256] = {};
  bool ignore_merges_ = false;

  // Pieces repeat a lot in natural text; caching them skips most merge work. Bounded: cleared
  // when full, which is cheap and keeps memory flat under adversarial input.
  static constexpr size_t kMaxCacheEntries = 1 << 16;
  static constexpr size_t kMaxCachedWordBytes = 128;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cascade::tokenizer::internal
