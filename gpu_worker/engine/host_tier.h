// The host KV tier: copies of KV blocks in host memory, keyed by the same chained block keys as
// the GPU tier. Blocks arrive as the GPU tier evicts them and are copied back on a prefix hit, so
// a restored block holds exactly the bytes it held on the GPU (cached == cold stays bitwise).
// Plain C++: it decides which host slot each block goes to and records the copies in order; the
// engine hands them to the backend (Backend::CopyBlocksToHost / FromHost) before the next step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/chunk_hash.h"
#include "gpu_worker/engine/backend.h"
#include "gpu_worker/engine/eviction.h"

namespace cascade::engine {

// One copy between a GPU block and a host slot, in the order decided.
struct HostCopyOp {
  bool to_host = true;  // GPU -> host (offload), else host -> GPU (restore)
  // An offload ahead of eviction (OffloadAhead): the GPU block stays cached, and the next step
  // need not wait for the copy (Backend::CopyBlocksToHostAhead).
  bool ahead = false;
  BlockCopy copy;
  hash::Hash128 key;  // the block's key
};

struct HostTierStats {
  int64_t slots = 0;            // capacity in blocks
  int64_t used = 0;             // slots holding a block
  int64_t offloaded = 0;        // blocks copied GPU -> host
  int64_t offloaded_ahead = 0;  // of those, copied ahead of their eviction (OffloadAhead)
  int64_t restored = 0;         // blocks copied host -> GPU
  int64_t evicted = 0;          // host copies dropped to make room
  int64_t imported = 0;         // blocks written from a peer's bytes (Import)
};

// Not thread-safe: the engine's step thread owns it.
//
// Eviction, like the GPU tier's, takes only leaves (no host copy names the key as its parent)
// in EvictionQueue order, so a prefix's head outlives its tail on the host too.
class HostKvTier {
 public:
  // `memory` holds num_slots * block_bytes bytes (Backend::AllocateHostKv). `now_ms`: the clock
  // retention is measured on.
  HostKvTier(int64_t num_slots, int64_t block_bytes, HostKvMemory memory,
             std::function<int64_t()> now_ms);

  bool Contains(const hash::Hash128& key) const { return slot_of_.count(key) > 0; }

  // GPU block `block`, holding `key`, is about to be reused: record a copy of it into a host slot
  // (evicting host copies if needed), unless the key is on the host already, in which case only
  // its hints and recency are updated.
  void Offload(int32_t block, const hash::Hash128& key, const hash::Hash128& parent,
               const EvictionHints& hints) {
    Record(block, key, parent, hints, /*ahead=*/false);
  }
  // GPU block `block`, holding `key`, is likely to be evicted soon but stays cached for now:
  // record a copy of it into a host slot (HostCopyOp::ahead), so that its eviction finds it on
  // the host and copies nothing. As Offload when the key is on the host already.
  void OffloadAhead(int32_t block, const hash::Hash128& key, const hash::Hash128& parent,
                    const EvictionHints& hints) {
    Record(block, key, parent, hints, /*ahead=*/true);
  }

  // Writes a block received from a peer into a host slot (evicting host copies if needed) and
  // returns true, or false when no slot could be had or `bytes` is not one block. A key already
  // on the host is left as it is (true). REQUIRES: no recorded copy is in flight
  // (Backend::WaitBlockCopies), since the slot taken may be one a copy reads or writes.
  bool Import(const hash::Hash128& key, const hash::Hash128& parent, const EvictionHints& hints,
              std::span<const std::byte> bytes);

  // Records a copy of `key`'s host copy into GPU block `block` and returns its hints. The host
  // copy stays (a later GPU eviction of the block then needs no copy). REQUIRES: Contains(key).
  EvictionHints Restore(const hash::Hash128& key, int32_t block);

  // Keeps these keys' host copies from being evicted until Unprotect() (admission protects the
  // copies it is about to restore while its allocations offload other blocks). An offload that
  // finds no unprotected copy to evict is skipped.
  void Protect(std::span<const hash::Hash128> keys);
  void Unprotect();

  // Drops the given keys and all their host descendants (found through the child index: the cost
  // is what is dropped, not the tier's size). The keys need not be on the host: a GPU-only key's
  // host descendants go too. Returns the number dropped.
  int64_t Erase(std::span<const hash::Hash128> keys);

  // The host bytes of `key` (KvBlockBytes() of them), or null. Valid until the next Offload or
  // Erase, and only once the copies recorded so far have run (Backend::WaitBlockCopies).
  const std::byte* Data(const hash::Hash128& key) const;

  // The copies recorded since the last call, in order. Their order matters: a slot read by a
  // restore may be overwritten by a later offload, a block written by an offload's source may be
  // refilled by a later restore.
  std::vector<HostCopyOp> TakeCopies();
  // Whether copies are recorded and not yet taken, and which.
  bool HasCopies() const { return !copies_.empty(); }
  std::span<const HostCopyOp> PendingCopies() const { return copies_; }
  // Keys dropped from the host tier since the last call.
  std::vector<hash::Hash128> TakeEvictedKeys();

  HostTierStats Stats() const;
  int64_t block_bytes() const { return block_bytes_; }

 private:
  struct Entry {
    bool used = false;
    bool is_protected = false;
    hash::Hash128 key;
    hash::Hash128 parent;
    EvictionHints hints;
    uint64_t last_use = 0;
  };
  std::byte* SlotData(int32_t slot) const { return memory_.get() + slot * block_bytes_; }
  void Record(int32_t block, const hash::Hash128& key, const hash::Hash128& parent,
              const EvictionHints& hints, bool ahead);
  void Drop(int32_t slot);
  // A slot for `key` (free, or an evicted leaf's), entered in the maps; -1 if none.
  int32_t TakeSlot(const hash::Hash128& key, const hash::Hash128& parent,
                   const EvictionHints& hints);
  void MaybeCandidate(int32_t slot);
  int64_t ChildCount(const hash::Hash128& key) const { return children_.Count(key); }

  // Set at construction.
  const int64_t block_bytes_;
  const HostKvMemory memory_;
  const std::function<int64_t()> now_ms_;

  std::vector<Entry> slots_;
  std::vector<int32_t> free_;
  std::unordered_map<hash::Hash128, int32_t, hash::Hash128Hasher> slot_of_;
  ChildIndex children_;      // parent key -> the slots whose keys name it
  EvictionQueue evictable_;  // host leaves
  uint64_t tick_ = 0;
  std::vector<int32_t> protected_;
  std::vector<HostCopyOp> copies_;
  std::vector<hash::Hash128> evicted_;
  HostTierStats stats_;
};

}  // namespace cascade::engine
