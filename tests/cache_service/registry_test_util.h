// Helpers shared by the registry tests: prompts built from token vectors, and a simulated engine
// that reports what it holds the way the worker does (held_tokens in full KV blocks).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "cache_service/registry/types.h"
#include "common/chunk_hash.h"

namespace cascade::registry::testing {

struct Prompt {
  std::string model = "m";
  std::string salt;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int32_t> kinds;
  std::vector<std::string> chunk_salts;

  std::vector<hash::ChunkSpec> Specs() const {
    std::vector<hash::ChunkSpec> s;
    for (size_t i = 0; i < tokens.size(); ++i) {
      s.push_back({kinds.empty() ? 1 : kinds[i], tokens[i],
                   chunk_salts.empty() ? std::string_view() : std::string_view(chunk_salts[i])});
    }
    return s;
  }
};

// `n` tokens starting at `first`, counting up.
inline std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

// What an engine with `block_size` holding the prompt's first `held_prefix` tokens (in full
// blocks) reports: one HeldChunk per chunk it holds at all.
inline std::vector<HeldChunk> HeldFor(const Prompt& p, int block_size, int64_t held_prefix) {
  std::vector<hash::ChunkSpec> specs = p.Specs();
  std::vector<hash::PlacedChunk> placed = hash::PlaceChunks(p.model, p.salt, specs);
  int64_t full = (held_prefix / block_size) * block_size;
  std::vector<HeldChunk> out;
  hash::Hash128 prev;
  for (size_t i = 0; i < placed.size(); ++i) {
    if (placed[i].start >= full) break;  // holds nothing of this chunk or later ones
    int64_t held = std::min(full, (placed[i].end / block_size) * block_size);
    out.push_back({placed[i].hash, placed[i].start, placed[i].end, held, prev, specs[i].kind});
    prev = placed[i].hash;
  }
  return out;
}

inline std::vector<ChunkEvent> Stored(const std::vector<HeldChunk>& held) {
  std::vector<ChunkEvent> e;
  for (const HeldChunk& c : held) e.push_back({ChunkEvent::Type::kStored, c});
  return e;
}

inline WorkerInfo Info(const std::string& id, const std::string& model = "m") {
  return WorkerInfo{id, "127.0.0.1:1", model, 1000, 16, 4096, 1000};
}

}  // namespace cascade::registry::testing
