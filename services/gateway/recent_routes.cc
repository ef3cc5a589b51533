// See recent_routes.h.
#include "services/gateway/recent_routes.h"

#include <algorithm>
#include <chrono>

namespace cascade::gateway {

RecentRoutes::RecentRoutes(int64_t ttl_ms, size_t capacity)
    : ttl_ms_(ttl_ms), capacity_(std::max<size_t>(capacity, 1)) {}

void RecentRoutes::Note(std::span<const RoutedChunk> chunks, std::string_view worker_id,
                        int64_t now_ms) {
  if (ttl_ms_ <= 0 || worker_id.empty()) return;
  MutexLock lock(&mu_);
  for (const RoutedChunk& c : chunks) {
    auto [it, fresh] = by_chunk_.try_emplace(c.hash);
    if (fresh) order_.push_back(c.hash);
    std::vector<Sent>& sent = it->second;
    auto same = std::find_if(sent.begin(), sent.end(),
                             [&](const Sent& s) { return s.worker_id == worker_id; });
    if (same != sent.end()) {
      same->at_ms = now_ms;
    } else if (sent.size() < kWorkersPerChunk) {
      sent.push_back(Sent{std::string(worker_id), now_ms});
    } else {  // the one noted longest ago makes room
      *std::min_element(sent.begin(), sent.end(), [](const Sent& a, const Sent& b) {
        return a.at_ms < b.at_ms;
      }) = Sent{std::string(worker_id), now_ms};
    }
  }
  // Drop the oldest chunks past the capacity, and expired ones from the front.
  while (!order_.empty()) {
    auto it = by_chunk_.find(order_.front());
    bool expired = true;
    for (const Sent& s : it->second) expired &= now_ms - s.at_ms > ttl_ms_;
    if (!expired && by_chunk_.size() <= capacity_) break;
    by_chunk_.erase(it);
    order_.pop_front();
  }
}

int RecentRoutes::Apply(std::span<const RoutedChunk> chunks, int64_t now_ms,
                        std::vector<Candidate>* candidates) const {
  for (Candidate& c : *candidates) c.routed_tokens = 0;
  if (ttl_ms_ <= 0) return 0;
  {
    MutexLock lock(&mu_);
    for (const RoutedChunk& chunk : chunks) {  // chained: a later chunk covers the earlier ones
      auto it = by_chunk_.find(chunk.hash);
      if (it == by_chunk_.end()) break;  // no later chunk can have been noted without this one
      for (const Sent& s : it->second) {
        if (now_ms - s.at_ms > ttl_ms_) continue;
        for (Candidate& c : *candidates) {
          if (c.worker_id == s.worker_id) c.routed_tokens = chunk.end;
        }
      }
    }
  }
  int raised = 0;
  for (const Candidate& c : *candidates) raised += c.routed_tokens > c.matched_tokens;
  return raised;
}

int64_t RecentRoutes::NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

size_t RecentRoutes::size() const {
  MutexLock lock(&mu_);
  return by_chunk_.size();
}

}  // namespace cascade::gateway
