// Plain request and result types of the engine: what a caller hands in and gets back.
// No gRPC types here; the worker service translates cascade.v2 messages to and from these.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/chunk_hash.h"

namespace cascade::engine {

// Mirrors cascade.v2.FinishReason value for value (static_asserts in sampling_wire.cc).
enum class FinishReason {
  kNone = 0,
  kStop = 1,
  kLength = 2,
  kStopString = 3,
  kCancelled = 4,
  kError = 5
};

const char* FinishReasonName(FinishReason r);

// Sampling parameters, validated by ValidateSampling() (sampler.h).
struct SamplingParams {
  float temperature = 0.0f;         // 0 = greedy
  float top_p = 1.0f;               // (0, 1]
  int32_t top_k = 0;                // 0 or -1 = disabled
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; 1 = off
  int32_t max_tokens = 16;          // >= 1
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t logprobs = 0;          // top logprobs per token, 0..20
  std::optional<uint64_t> seed;  // unset: the engine draws one
};

// One chunk of a prompt, as token ids.
struct ChunkInput {
  int32_t kind = 0;  // cascade.v2.ChunkKind value (part of the chunk hash)
  std::vector<int32_t> tokens;
  std::string cache_salt;  // per-chunk salt; empty = inherit
};

// One KV block fetched from a peer worker, already verified by the caller (its key is the key
// this prompt gives the block, its bytes passed the transfer's checksum). The engine writes it
// into its host KV tier before the request is scheduled, so admission finds it there and restores
// it like any host hit.
struct PeerBlock {
  hash::Hash128 key;
  hash::Hash128 parent;  // the previous block's key; zero for the first block
  std::string bytes;     // Backend::KvBlockBytes() bytes in the backend's layout
};

// Blocks copied out of this engine for a peer (Engine::ExportBlocks).
struct ExportedBlock {
  hash::Hash128 key;
  std::string bytes;  // Backend::KvBlockBytes() bytes
};
struct ExportBatch {
  absl::Status status;                // not OK: nothing could be copied (e.g. the backend failed)
  int64_t held = 0;                   // leading keys of the request held now in either tier
  std::vector<ExportedBlock> blocks;  // the first of those, in order (bounded by max_bytes)
};

struct Request {
  std::string request_id;
  std::string cache_salt;          // request-level salt
  std::vector<ChunkInput> chunks;  // the prompt is their concatenation
  SamplingParams sampling;
  int64_t pin_ttl_ms = 0;  // > 0: keep the prompt's chunks cached this long
  // Eviction hints for the prompt's blocks, in both KV tiers (eviction.h): blocks of a higher
  // priority are evicted after lower ones; for retention_ms they are evicted only when nothing
  // else can be.
  int32_t priority = 0;
  int64_t retention_ms = 0;
  // hash::PlaceChunks of `chunks` under this engine's model and `cache_salt`, when the caller
  // computed it already (the worker service does, to check the gateway's hashes); empty: the
  // engine computes it. Either way the prompt's chain is hashed once per request.
  std::vector<hash::PlacedChunk> placed;
  // Leading prompt blocks fetched from a peer (keys in prompt order, without gaps); imported into
  // the host tier before the request is scheduled. Ignored without a host tier.
  std::vector<PeerBlock> peer_blocks;
};

// Per chunk of an admitted request: where it sits and how much came from cache.
struct ChunkPlacement {
  hash::Hash128 hash;
  int64_t start = 0;
  int64_t end = 0;
  int64_t cached_tokens = 0;
  int32_t kind = 0;
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

struct LogprobEntry {
  TokenLogprob sampled;
  std::vector<TokenLogprob> top;
};

// What one step produced for one sequence. `started` is set on the first output of a sequence
// (after its prefix-cache lookup), with `chunks` and the cached token count.
struct SequenceOutput {
  uint64_t seq_id = 0;
  bool started = false;
  std::vector<ChunkPlacement> chunks;  // set when started
  std::vector<int32_t> new_tokens;
  std::vector<LogprobEntry> logprobs;  // parallel to new_tokens when requested
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  int32_t stop_token_id = -1;  // with kStop
  // Why the sequence ended early: set with kError (RESOURCE_EXHAUSTED when the KV cache or the
  // backend's memory had no room for it, INTERNAL for a backend failure) and with kCancelled when
  // the worker shut down under it (UNAVAILABLE). OK otherwise, including a client's cancel.
  absl::Status status;
  std::vector<std::vector<float>> logits;  // per sampled token, only with debug_capture_logits
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
};

// Where a KV block lives (cascade.v1.KvTier values).
enum class KvTier { kGpu = 1, kHost = 2 };

// A chunk the worker now holds (or no longer holds), for the registry.
struct ChunkEvent {
  bool stored = true;  // false = evicted
  hash::Hash128 hash;
  hash::Hash128 parent;  // zero for the first chunk
  int64_t start = 0;
  int64_t end = 0;
  int64_t held_tokens = 0;  // leading prompt tokens up to `end` held in full blocks
  int32_t kind = 0;
  KvTier tier = KvTier::kGpu;  // of its last held block
};

struct EngineStats {
  int32_t running = 0;
  int32_t waiting = 0;
  int64_t total_blocks = 0;
  int64_t free_blocks = 0;             // never used or cached-and-unreferenced
  int64_t used_blocks = 0;             // referenced by live sequences or pins
  int64_t cached_blocks = 0;           // hashed, referenced or not
  int64_t prefix_cache_queries = 0;    // prompt tokens looked up
  int64_t prefix_cache_hits = 0;       // of those, found (in either tier)
  int64_t prefix_cache_hits_host = 0;  // of the hits, restored from the host tier
  // Host KV tier (all zero when it is off).
  int64_t host_total_blocks = 0;
  int64_t host_used_blocks = 0;
  int64_t host_offloaded_blocks = 0;  // copied GPU -> host
  int64_t host_restored_blocks = 0;   // copied host -> GPU
  int64_t host_evicted_blocks = 0;    // host copies dropped for room
  int64_t host_copy_failures = 0;     // block copy batches that failed (their keys dropped)
  int64_t peer_imported_blocks = 0;   // blocks from peers written into the host tier
  int64_t peer_exported_blocks = 0;   // blocks copied out for peers
  int64_t preemptions = 0;
  int64_t pinned_chunks = 0;  // chunks with a pin
  int64_t pinned_blocks = 0;  // held by at least one pin (at most max_pinned_fraction of all)
  // Chunk pins not taken: they would have passed that cap (once per request's pin, once per
  // registry pin however often its heartbeats renew it while it stays refused).
  int64_t pins_refused = 0;
  int64_t held_chunks = 0;  // chunks recorded as held (what the registry is told)
  // Chunk records dropped (and withdrawn from the registry) for
  // EngineOptions::max_chunks_per_block.
  int64_t held_chunks_displaced = 0;
  int64_t prompt_tokens_computed = 0;
  int64_t generation_tokens = 0;
  int64_t steps = 0;
  // Steps scheduled and built while the step before them ran (EngineOptions::overlap_schedule).
  int64_t overlapped_steps = 0;
};

}  // namespace cascade::engine
