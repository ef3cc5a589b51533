// Prompts this gateway has sent to workers lately, so that routing counts them as held before
// the registry hears of them. A worker registers a chunk's blocks once it has prefilled them (its
// agent reports after the step), so requests sharing a new prefix that arrive together (a burst
// after a deploy, an OpenAI request's n choices) would otherwise see no holder and spread over
// workers that each prefill it again; noted when the request is sent, so a burst routed within
// the same millisecond sees it too (the load term still spreads a burst its holder cannot take).
// Keyed by chained chunk hash: a worker that got a prompt will hold every whole-chunk prefix of
// it. Entries expire after `ttl_ms` (by then the registry
// knows, or the worker evicted or never stored it) and the oldest go first past `capacity`.
// Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/chunk_hash.h"
#include "common/mutex.h"
#include "services/gateway/router.h"

namespace cascade::gateway {

// One chunk of a prompt: its chained hash and its end in tokens.
struct RoutedChunk {
  hash::Hash128 hash;
  int64_t end = 0;
};

class RecentRoutes {
 public:
  // ttl_ms <= 0: nothing is kept (Note and Apply do nothing).
  RecentRoutes(int64_t ttl_ms, size_t capacity);

  // A prompt of these chunks was sent to `worker_id` at `now_ms`.
  void Note(std::span<const RoutedChunk> chunks, std::string_view worker_id, int64_t now_ms);

  // Sets each candidate's routed_tokens to the end of the longest whole-chunk prefix of `chunks`
  // noted for its worker within the ttl (0 if none). Returns how many candidates got one above
  // the registry's matched_tokens.
  int Apply(std::span<const RoutedChunk> chunks, int64_t now_ms,
            std::vector<Candidate>* candidates) const;

  size_t size() const;

  // The clock Note and Apply are given (steady, milliseconds).
  static int64_t NowMs();

 private:
  struct Sent {
    std::string worker_id;
    int64_t at_ms = 0;
  };
  // A chunk is noted for a few workers at most: a prefix that hot spreads by load anyway.
  static constexpr size_t kWorkersPerChunk = 4;

  const int64_t ttl_ms_;
  const size_t capacity_;
  mutable Mutex mu_;
  absl::flat_hash_map<hash::Hash128, std::vector<Sent>, hash::Hash128Hasher> by_chunk_
      ABSL_GUARDED_BY(mu_);
  std::deque<hash::Hash128> order_ ABSL_GUARDED_BY(mu_);  // chunks by first note, oldest first
};

}  // namespace cascade::gateway
