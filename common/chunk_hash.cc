// SHA-256 (OpenSSL) over a fixed, documented byte layout; see chunk_hash.h.
#include "common/chunk_hash.h"

#include <openssl/evp.h>

#include <array>
#include <cstring>

namespace cascade::hash {
namespace {

// Little-endian appenders: the byte layout must not depend on the host.
void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64BE(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutHash(std::string& out, const Hash128& h) {
  PutU64BE(out, h.hi);
  PutU64BE(out, h.lo);
}
void PutBytes(std::string& out, std::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}
void PutTokens(std::string& out, std::span<const int32_t> tokens) {
  PutU32(out, static_cast<uint32_t>(tokens.size()));
  for (int32_t t : tokens) PutU32(out, static_cast<uint32_t>(t));
}

Hash128 Digest(const std::string& msg) {
  std::array<unsigned char, 32> md{};
  unsigned int len = 0;
  // EVP_Digest is one-shot and thread-safe; failure only on allocation, where aborting is right.
  if (EVP_Digest(msg.data(), msg.size(), md.data(), &len, EVP_sha256(), nullptr) != 1) abort();
  Hash128 h;
  for (int i = 0; i < 8; ++i) h.hi = (h.hi << 8) | md[i];
  for (int i = 8; i < 16; ++i) h.lo = (h.lo << 8) | md[i];
  return h;
}

}  // namespace

std::string Hash128::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = kDigits[(hi >> (4 * i)) & 0xf];
    s[31 - i] = kDigits[(lo >> (4 * i)) & 0xf];
  }
  return s;
}

std::optional<Hash128> Hash128::FromHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  Hash128 h;
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    int v;
    if (c >= '0' && c <= '9')
      v = c - '0';
    else if (c >= 'a' && c <= 'f')
      v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      v = c - 'A' + 10;
    else
      return std::nullopt;
    uint64_t& word = i < 16 ? h.hi : h.lo;
    word = (word << 4) | static_cast<uint64_t>(v);
  }
  return h;
}

Hash128 FoldSalt(const Hash128& state, std::string_view salt) {
  if (salt.empty()) return state;
  std::string msg("cascade.salt.v1");
  msg.push_back('\0');
  PutHash(msg, state);
  PutBytes(msg, salt);
  return Digest(msg);
}

Hash128 ChunkHash(const Hash128& prev, std::string_view model, const Hash128& salt_state,
                  int32_t kind, std::span<const int32_t> tokens) {
  std::string msg("cascade.chunk.v1");
  msg.push_back('\0');
  PutHash(msg, prev);
  PutBytes(msg, model);
  PutHash(msg, salt_state);
  PutU32(msg, static_cast<uint32_t>(kind));
  PutTokens(msg, tokens);
  return Digest(msg);
}

Hash128 BlockHash(const Hash128& prev, std::string_view model, const Hash128& salt_state,
                  std::span<const int32_t> tokens) {
  std::string msg("cascade.block.v1");
  msg.push_back('\0');
  PutHash(msg, prev);
  PutBytes(msg, model);
  PutHash(msg, salt_state);
  PutTokens(msg, tokens);
  return Digest(msg);
}

std::vector<PlacedChunk> PlaceChunks(std::string_view model, std::string_view request_salt,
                                     std::span<const ChunkSpec> chunks) {
  std::vector<PlacedChunk> out;
  out.reserve(chunks.size());
  Hash128 prev;
  Hash128 salt = FoldSalt(Hash128{}, request_salt);
  int64_t pos = 0;
  for (const ChunkSpec& c : chunks) {
    salt = FoldSalt(salt, c.cache_salt);
    PlacedChunk p;
    p.hash = ChunkHash(prev, model, salt, c.kind, c.tokens);
    p.salt_state = salt;
    p.start = pos;
    p.end = pos + static_cast<int64_t>(c.tokens.size());
    pos = p.end;
    prev = p.hash;
    out.push_back(p);
  }
  return out;
}

std::vector<Hash128> BlockKeys(std::string_view model, std::string_view request_salt,
                               std::span<const ChunkSpec> chunks, int block_size) {
  return BlockKeys(model, PlaceChunks(model, request_salt, chunks), chunks, block_size);
}

std::vector<Hash128> BlockKeys(std::string_view model, std::span<const PlacedChunk> placed,
                               std::span<const ChunkSpec> chunks, int block_size) {
  std::vector<int32_t> tokens;
  std::vector<Hash128> salt_at;  // salt state per token
  for (size_t i = 0; i < chunks.size(); ++i) {
    tokens.insert(tokens.end(), chunks[i].tokens.begin(), chunks[i].tokens.end());
    salt_at.insert(salt_at.end(), chunks[i].tokens.size(), placed[i].salt_state);
  }
  std::vector<Hash128> keys;
  if (block_size <= 0) return keys;
  Hash128 prev;
  for (size_t end = block_size; end <= tokens.size(); end += block_size) {
    std::span<const int32_t> block(tokens.data() + end - block_size, block_size);
    prev = BlockHash(prev, model, salt_at[end - 1], block);
    keys.push_back(prev);
  }
  return keys;
}

}  // namespace cascade::hash
