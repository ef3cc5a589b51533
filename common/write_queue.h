// Write coalescing for streaming RPCs, the one implementation the gateway's reactors and the
// worker's share: items queue while a write is in flight and go out one at a time, and an item
// that can merge into the last queued one does (token deltas), so a slow reader gets fewer, larger
// messages and a fast one gets each at once, and the queue never holds more than one mergeable run
// between two other items.
#pragma once

#include <cstddef>
#include <deque>
#include <utility>

namespace cascade::common {

// `Merge(into, from)` folds `from` into `into` and returns true when the two can be sent as one
// message (both token deltas); false leaves both unchanged. Not thread-safe: the owning reactor
// holds its lock around every call.
template <typename Item, bool (*Merge)(Item& into, const Item& from)>
class CoalescingWriteQueue {
 public:
  // Queues `item`, merged into the last queued one where Merge allows. Dropped once broken.
  void Push(Item item) {
    if (broken_) return;
    if (!queue_.empty() && Merge(queue_.back(), item)) return;
    queue_.push_back(std::move(item));
  }
  // Moves the next item into `*out` and marks a write in flight; false when a write is in flight
  // already, nothing is queued, or a write failed (the reader is gone).
  bool Next(Item* out) {
    if (writing_ || queue_.empty() || broken_) return false;
    *out = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    return true;
  }
  // The write in flight completed. A failed write means the reader is gone: what is queued is
  // dropped and nothing more goes out. Returns true on that failure (the caller cancels its work).
  bool Done(bool ok) {
    writing_ = false;
    if (ok) return false;
    broken_ = true;
    queue_.clear();
    return true;
  }
  bool writing() const { return writing_; }
  bool broken() const { return broken_; }
  size_t queued() const { return queue_.size(); }

 private:
  std::deque<Item> queue_;
  bool writing_ = false;
  bool broken_ = false;
};

}  // namespace cascade::common
