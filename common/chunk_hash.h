// The one hash definition of Cascade: chained 128-bit hashes of chunks and KV blocks.
// The registry, the gateway and the engine all link this library, so they agree bit for bit.
// Layout and rationale: docs/ARCHITECTURE.md, "Hashing".
#pragma once

#include <compare>
#include <cstdint>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cascade::hash {

// The first 128 bits of a SHA-256 digest; `hi` holds digest bytes 0..7 big-endian.
struct Hash128 {
  uint64_t hi = 0;
  uint64_t lo = 0;

  bool IsZero() const { return hi == 0 && lo == 0; }
  // 32 lowercase hex characters.
  std::string ToHex() const;
  // Parses 32 hex characters (either case); nullopt on anything else.
  static std::optional<Hash128> FromHex(std::string_view hex);
  auto operator<=>(const Hash128&) const = default;
};

// For unordered containers: the bits are already uniform.
struct Hash128Hasher {
  size_t operator()(const Hash128& h) const {
    return static_cast<size_t>(h.lo ^ (h.hi * 0x9e3779b97f4a7c15ULL));
  }
};

// Salt state: the running isolation key. Starts at zero (no salt); each non-empty salt,
// request-level first and then per chunk, is folded in. An empty salt leaves it unchanged.
Hash128 FoldSalt(const Hash128& state, std::string_view salt);

// hash_i = H("cascade.chunk.v1", prev, model, salt_state, kind, tokens). `prev` is zero for the
// first chunk.
Hash128 ChunkHash(const Hash128& prev, std::string_view model, const Hash128& salt_state,
                  int32_t kind, std::span<const int32_t> tokens);

// key_j = H("cascade.block.v1", prev, model, salt_state, tokens of block j). `prev` is zero for
// block 0; `salt_state` is the state in force at the block's last token.
Hash128 BlockHash(const Hash128& prev, std::string_view model, const Hash128& salt_state,
                  std::span<const int32_t> tokens);

// One chunk of a prompt, as the hashing sees it.
struct ChunkSpec {
  int32_t kind = 0;                 // cascade.v2.ChunkKind value
  std::span<const int32_t> tokens;  // the chunk's token ids
  std::string_view cache_salt;      // per-chunk salt; empty = inherit
};

// A chunk placed in the prompt.
struct PlacedChunk {
  Hash128 hash;        // chained chunk hash
  Hash128 salt_state;  // salt state in force for this chunk's tokens
  int64_t start = 0;   // first global position
  int64_t end = 0;     // one past the last
};

// The one chunk-spec builder: specs viewing any chunks with `kind`, `tokens` and `cache_salt`
// members (the gateway's PromptChunk, the engine's ChunkInput). The specs point into `chunks`,
// which must outlive them and stay unchanged.
template <typename Chunks>
std::vector<ChunkSpec> SpecsOf(const Chunks& chunks) {
  std::vector<ChunkSpec> specs;
  specs.reserve(std::size(chunks));
  for (const auto& c : chunks) {
    specs.push_back(ChunkSpec{static_cast<int32_t>(c.kind), c.tokens, c.cache_salt});
  }
  return specs;
}

// Chains the hashes and positions of a prompt's chunks: start_i = end_{i-1}, from 0.
std::vector<PlacedChunk> PlaceChunks(std::string_view model, std::string_view request_salt,
                                     std::span<const ChunkSpec> chunks);

// Keys of the full KV blocks of a prompt (tokens = concatenation of `chunks`' tokens), each over
// all tokens up to its end with the salt state in force at its last token. A trailing partial
// block has no key.
std::vector<Hash128> BlockKeys(std::string_view model, std::string_view request_salt,
                               std::span<const ChunkSpec> chunks, int block_size);
// The same keys for chunks already placed (`placed` = PlaceChunks(model, request_salt, chunks)),
// so a caller that placed them does not hash the prompt's chain a second time.
// REQUIRES: placed.size() == chunks.size().
std::vector<Hash128> BlockKeys(std::string_view model, std::span<const PlacedChunk> placed,
                               std::span<const ChunkSpec> chunks, int block_size);

}  // namespace cascade::hash
