// The shared write coalescing (common/write_queue.h): one write in flight at a time, deltas queued
// behind it merge, other items keep their order and are never merged across, and a failed write
// drops the rest for good.
#include "common/write_queue.h"

#include <gtest/gtest.h>

#include <string>

namespace cascade::common {
namespace {

struct Item {
  bool delta = false;
  std::string text;
};

bool MergeDeltas(Item& into, const Item& from) {
  if (!into.delta || !from.delta) return false;
  into.text += from.text;
  return true;
}

using Queue = CoalescingWriteQueue<Item, MergeDeltas>;

Item Delta(std::string t) { return Item{true, std::move(t)}; }
Item Other(std::string t) { return Item{false, std::move(t)}; }

TEST(CoalescingWriteQueueTest, AnIdleStreamWritesEachItemAtOnce) {
  Queue q;
  Item out;
  for (const char* t : {"a", "b", "c"}) {
    q.Push(Delta(t));
    ASSERT_TRUE(q.Next(&out));
    EXPECT_EQ(out.text, t) << "a fast reader gets every delta as its own message";
    EXPECT_FALSE(q.Done(true));
  }
  EXPECT_FALSE(q.Next(&out));
}

TEST(CoalescingWriteQueueTest, DeltasQueuedBehindAWriteInFlightMergeIntoOne) {
  Queue q;
  Item out;
  q.Push(Delta("a"));
  ASSERT_TRUE(q.Next(&out));
  for (const char* t : {"b", "c", "d"}) q.Push(Delta(t));
  EXPECT_EQ(q.queued(), 1u);
  EXPECT_FALSE(q.Next(&out)) << "one write at a time";
  EXPECT_TRUE(q.writing());
  q.Done(true);
  ASSERT_TRUE(q.Next(&out));
  EXPECT_EQ(out.text, "bcd");
}

TEST(CoalescingWriteQueueTest, OtherItemsKeepTheirOrderAndAreNotMergedAcross) {
  Queue q;
  Item out;
  q.Push(Other("start"));
  ASSERT_TRUE(q.Next(&out));
  q.Push(Delta("a"));
  q.Push(Delta("b"));
  q.Push(Other("finish"));
  q.Push(Delta("c"));
  std::vector<std::string> written;
  while (true) {
    q.Done(true);
    if (!q.Next(&out)) break;
    written.push_back(out.text);
  }
  EXPECT_EQ(written, (std::vector<std::string>{"ab", "finish", "c"}));
}

TEST(CoalescingWriteQueueTest, AFailedWriteDropsTheRestForGood) {
  Queue q;
  Item out;
  q.Push(Delta("a"));
  ASSERT_TRUE(q.Next(&out));
  q.Push(Other("finish"));
  EXPECT_TRUE(q.Done(false)) << "the caller learns the reader is gone";
  EXPECT_TRUE(q.broken());
  EXPECT_EQ(q.queued(), 0u);
  EXPECT_FALSE(q.Next(&out));
  q.Push(Delta("late"));
  EXPECT_FALSE(q.Next(&out));
  EXPECT_FALSE(q.writing());
}

}  // namespace
}  // namespace cascade::common
