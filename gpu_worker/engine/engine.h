// The backend-neutral engine: admits requests given as chunks of token ids, reuses the longest
// cached prefix, prefills the rest at global positions, decodes in a continuous batch, samples,
// and reports which chunks it holds. Each Step() reads as intake, schedule, run, postprocess.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/engine/backend.h"
#include "gpu_worker/engine/types.h"

namespace cascade::engine {

struct EngineOptions {
  std::string model_name;  // part of every hash
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  int64_t max_context = 4096;       // prompt + generated tokens at most
  int32_t max_tokens_limit = 4096;  // cap on sampling.max_tokens
  int max_waiting = 1024;           // queued requests beyond this: RESOURCE_EXHAUSTED
  // Pins (Request::pin_ttl_ms, PinChunks) hold at most this share of the KV blocks, and there are
  // at most as many pins as that many blocks; a chunk whose pin would pass either is not pinned
  // (EngineStats::pins_refused), so one client pinning prompt after prompt cannot take the KV
  // that other requests need. In [0, 1]: 1 pins may hold every block, 0 no pins.
  double max_pinned_fraction = 0.5;
  // Chunks reported to the registry through one KV block (as the last block they are held
  // through) at most, pinned ones aside: the same tokens under other chunk boundaries or kinds
  // are other chunks over the same blocks, so without a cap a client could grow the worker's
  // records (and the registry's) without bound. Past it the least recently used one is dropped
  // and withdrawn from the registry (EngineStats::held_chunks_displaced). At least 1.
  int max_chunks_per_block = 8;
  // Queue chunk stored/evicted events for TakeChunkEvents. Off where nothing takes them (a worker
  // without a registry): they would pile up for the process's life. HeldChunks answers either way.
  bool chunk_events = true;
  bool enable_prefix_cache = true;
  // A waiting request whose next uncached block a running sequence is still computing waits
  // for it, up to this many steps, then starts with a hit (SchedulerOptions::max_prefix_waits).
  int max_prefix_waits = 32;
  // Prompt-logprob rows per step at most (SchedulerOptions::max_prompt_logprob_rows).
  int max_prompt_logprob_rows = 4096;
  // Host KV tier: bytes of host memory (Backend::AllocateHostKv) for copies of blocks the GPU
  // tier evicts; 0 = off. Off as well when the backend has no block I/O.
  int64_t host_kv_bytes = 0;
  // With the host tier: once fewer than this many GPU blocks are free, the cached blocks that
  // eviction would take next (up to this many beyond the free ones) are copied to the host ahead
  // of time and stay cached (BlockManager::ForNextVictims, HostKvTier::OffloadAhead), so an
  // eviction finds its block on the host and the step that reuses it waits for no copy. Without
  // it every eviction's copy ran before the step reusing the block: on an H200 (qwen3-0.6b,
  // every prompt new, the GPU cache full) 190 req/s against 275 with the tier off
  // (bench/service/RESULTS.md, session 51). -1: four steps' worth of allocations
  // (4 * max_num_batched_tokens / block size + max_num_seqs) up to a quarter of the blocks;
  // 0: off (each eviction copies, and the next step waits for it).
  int64_t host_offload_ahead_blocks = -1;
  // With the host tier, its write policy: a block evicted from the GPU (or copied ahead of its
  // eviction) goes to the host only if its content was taken again at least this many times
  // while cached (BlockManager::Uses: prefix hits, restores); the others are dropped, counted
  // in EngineStats::host_offload_skipped_blocks. 0 (the default): every block, as a write-through
  // tier. 1 is SGLang's "write_through_selective" idea: traffic of unique prompts then pays no
  // copies (on an H200, with the GPU cache full and every prompt new, the tier cost 6-10% of the
  // requests a second even with copies ahead, bench/service/RESULTS.md session 51), while a
  // prefix reused while cached still outlives its GPU blocks. A prefix that comes back only
  // after its eviction (a long cycle over more prefixes than the GPU holds) is then recomputed.
  int32_t host_offload_min_uses = 0;
  std::vector<int32_t> eos_token_ids;  // from the model's config
  // Overlapped scheduling (SGLang's overlap scheduler, vLLM's async scheduling): while the
  // backend runs step n, the host finishes step n-1's outputs and schedules step n+1 and builds
  // its batch, so the host's work hides behind the device's. Step n+1 is scheduled as if every
  // sequence of step n went on; one that ends there (a stop token, a cancel) is dropped from it
  // before it is launched. The tokens are the same as without; each Step() returns the outputs
  // of the step launched by the call before it.
  bool overlap_schedule = false;
  // With overlap_schedule: the next step is scheduled while one of at least this many sequences
  // runs; after a smaller step the engine collects it first, as without overlap (either way the
  // same tokens). Measured on an H200 (qwen3-0.6b, bench/engine/RESULTS.md session 36, two engines
  // each, same process): the overlapped schedule was 0-25% slower at 1-8 rows, even at 16 and 64,
  // 2-6% faster at 32, 128 and 256. 0: every step overlapped.
  int overlap_min_rows = 0;
  // Test-only fault: block keys that ignore the previous block (the design's root cause 2).
  bool debug_unchained_block_keys = false;
  // Test-only: return each sampled position's raw logits in SequenceOutput::logits.
  bool debug_capture_logits = false;
  // Peer fetch: bytes of blocks copied out for peers per step at most (ExportBlocks), and of
  // peer blocks written into the host tier per step (Request::peer_blocks), so neither stalls
  // the step loop for long.
  int64_t export_bytes_per_step = int64_t{64} << 20;
  int64_t import_bytes_per_step = int64_t{256} << 20;
  // Milliseconds on a steady clock; injectable for pin expiry tests.
  std::function<int64_t()> now_ms;
};

// Thread safety: AddRequest, Cancel, EvictChunks, ExportBlocks, HeldPrefixTokens, Stats,
// HeldChunks and TakeChunkEvents may be called from any thread; Step() from one thread at a time
// (the worker's engine loop).
class Engine {
 public:
  virtual ~Engine() = default;

  // Validates and queues a request. INVALID_ARGUMENT names the bad field; RESOURCE_EXHAUSTED
  // when the queue is full or the request can never fit in the KV cache. Returns its sequence id.
  virtual absl::StatusOr<uint64_t> AddRequest(Request request) = 0;

  // Cancels a sequence: its blocks are freed at the start of the next step, and that step's
  // outputs carry its final output with kCancelled. Unknown or finished ids are ignored.
  virtual void Cancel(uint64_t seq_id) = 0;

  // Drops the cached, unreferenced blocks of these chunks (and of their descendants) at the
  // next step, and those in use once their last reader releases them; unpins them. Returns the
  // number of chunks found.
  virtual int EvictChunks(const std::vector<hash::Hash128>& chunk_hashes) = 0;

  // Pins chunks this engine holds for `ttl_ms` (extending pins already there), so eviction skips
  // their blocks: the registry's pinned chunks, renewed with every heartbeat. Applied at the next
  // step; chunks not held, and new pins past max_pinned_fraction, are ignored. Returns the number
  // found.
  virtual int PinChunks(const std::vector<hash::Hash128>& chunk_hashes, int64_t ttl_ms) = 0;

  // Copies out, at a coming step, the blocks of the leading run of `keys` (a chain of block
  // keys, root first) that this engine holds in either tier, at most `max_bytes` of them (at
  // least one block); `done` gets them on the step thread and must not block. Requests are
  // answered in order within export_bytes_per_step per step, between steps, so the engine keeps
  // serving while a peer reads; blocks are copied, never held, so nothing stays referenced.
  virtual void ExportBlocks(std::vector<hash::Hash128> keys, int64_t max_bytes,
                            std::function<void(ExportBatch)> done) = 0;

  // Leading tokens of a prompt placed as `placed` that this engine holds (in full blocks, either
  // tier), by its chunk records: what a peer fetch need not bring.
  virtual int64_t HeldPrefixTokens(const std::vector<hash::PlacedChunk>& placed) const = 0;

  // Runs one step. Returns the outputs of every sequence that produced something. A backend
  // failure ends that step's sequences with kError (why in `status`), not the engine.
  virtual absl::StatusOr<std::vector<SequenceOutput>> Step() = 0;

  // True if a Step() would do something (queued work, cancels or admin operations).
  virtual bool HasWork() const = 0;

  virtual EngineStats Stats() const = 0;
  // Every chunk the engine holds now (for a registry resync).
  virtual std::vector<ChunkEvent> HeldChunks() const = 0;
  // Chunk stored/evicted events since the last call, in order.
  virtual std::vector<ChunkEvent> TakeChunkEvents() = 0;

  // OK, or why the host KV tier asked for by host_kv_bytes could not be set up (the engine
  // then runs without it).
  virtual absl::Status HostTierStatus() const = 0;

  virtual const EngineOptions& options() const = 0;
  virtual Backend& backend() = 0;
};

// The engine takes ownership of the backend.
std::unique_ptr<Engine> NewEngine(const EngineOptions& options, std::unique_ptr<Backend> backend);

}  // namespace cascade::engine
