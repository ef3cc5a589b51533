// Block export and import for peer fetch; see peer_blocks.h.
#include "gpu_worker/engine/peer_blocks.h"

#include <algorithm>
#include <cstring>

namespace cascade::engine {

int64_t HeldRun(std::span<const hash::Hash128> keys, const BlockManager& blocks,
                const HostKvTier* host) {
  int64_t n = 0;
  for (const hash::Hash128& k : keys) {
    if (!blocks.IsCachedKey(k) && (host == nullptr || !host->Contains(k))) break;
    ++n;
  }
  return n;
}

std::vector<ExportBatch> CopyOutBlocks(std::span<const ExportRequest> requests,
                                       const BlockManager& blocks, const HostKvTier* host,
                                       Backend& backend) {
  const int64_t block_bytes = backend.KvBlockBytes();
  std::vector<ExportBatch> out(requests.size());
  if (block_bytes <= 0) {
    for (ExportBatch& b : out) {
      b.status = absl::FailedPreconditionError("this worker's backend has no KV block I/O");
    }
    return out;
  }
  std::vector<BlockCopy> gpu;
  struct HostRead {
    std::byte* dst;
    hash::Hash128 key;
  };
  std::vector<HostRead> host_reads;
  for (size_t r = 0; r < requests.size(); ++r) {
    const ExportRequest& req = requests[r];
    ExportBatch& batch = out[r];
    batch.held = HeldRun(req.keys, blocks, host);
    const int64_t n = std::min(batch.held, std::max<int64_t>(1, req.max_bytes / block_bytes));
    batch.blocks.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      ExportedBlock& b = batch.blocks[i];
      b.key = req.keys[i];
      b.bytes.resize(block_bytes);
      auto* dst = reinterpret_cast<std::byte*>(b.bytes.data());
      // The GPU copy when there is one (it is the block the engine reads), else the host copy.
      if (std::optional<int32_t> block = blocks.Lookup(b.key)) {
        gpu.push_back(BlockCopy{*block, dst});
      } else {
        host_reads.push_back({dst, b.key});
      }
    }
  }
  absl::Status st = backend.CopyBlocksToHost(gpu);
  if (absl::Status w = backend.WaitBlockCopies(); st.ok()) st = w;
  if (!st.ok()) {
    for (ExportBatch& b : out) {
      b.status = st;
      b.blocks.clear();
    }
    return out;
  }
  for (const HostRead& h : host_reads) std::memcpy(h.dst, host->Data(h.key), block_bytes);
  return out;
}

int64_t ImportBlocks(std::span<const PeerBlock> blocks, size_t* next, int64_t* budget_bytes,
                     const BlockManager& cache, HostKvTier* host, const EvictionHints& hints) {
  int64_t written = 0;
  while (*next < blocks.size() && *budget_bytes > 0) {
    const PeerBlock& b = blocks[*next];
    if (cache.IsCachedKey(b.key) || host->Contains(b.key)) {
      ++*next;
      continue;
    }
    if (!host->Import(b.key, b.parent, hints, std::as_bytes(std::span(b.bytes)))) {
      *next = blocks.size();
      break;
    }
    host->Protect(std::span(&b.key, 1));  // a later block of the chain must not evict it
    ++*next;
    ++written;
    *budget_bytes -= static_cast<int64_t>(b.bytes.size());
  }
  return written;
}

}  // namespace cascade::engine
