// KV blocks out of an engine for a peer worker, and into it from one (peer fetch, issue 13).
// Plain C++ over the block manager, the host tier and the backend's block I/O; the engine calls
// these on its step thread between steps, when every committed block holds its final bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "gpu_worker/engine/backend.h"
#include "gpu_worker/engine/block_manager.h"
#include "gpu_worker/engine/host_tier.h"
#include "gpu_worker/engine/types.h"

namespace cascade::engine {

// A peer's request for blocks (Engine::ExportBlocks).
struct ExportRequest {
  std::vector<hash::Hash128> keys;  // a chain, root first
  int64_t max_bytes = 0;            // bytes to copy at most (at least one block is)
  std::function<void(ExportBatch)> done;
};

// The leading run of `keys` held in either tier.
int64_t HeldRun(std::span<const hash::Hash128> keys, const BlockManager& blocks,
                const HostKvTier* host);

// Answers the requests: each batch holds the leading run held now and copies of its first
// blocks. GPU blocks of all requests go in one CopyBlocksToHost, then one WaitBlockCopies (which
// also orders the host tier's own pending copies before its slots are read). Batches parallel
// to `requests`; on a backend error every batch carries it.
std::vector<ExportBatch> CopyOutBlocks(std::span<const ExportRequest> requests,
                                       const BlockManager& blocks, const HostKvTier* host,
                                       Backend& backend);

// Writes `blocks[*next..]` into the host tier, skipping keys either tier holds already, until
// `*budget_bytes` is spent (it is decreased) or a block finds no slot (then the rest is dropped
// and *next set to the end: those tokens are prefilled). The caller has waited for the block
// copies in flight. Blocks written stay protected (HostKvTier::Protect) until the caller's
// Unprotect. Returns the number of blocks written.
int64_t ImportBlocks(std::span<const PeerBlock> blocks, size_t* next, int64_t* budget_bytes,
                     const BlockManager& cache, HostKvTier* host, const EvictionHints& hints);

}  // namespace cascade::engine
