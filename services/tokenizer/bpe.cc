// Byte-level alphabet and BPE merging.
#include "services/tokenizer/bpe.h"

#include <algorithm>
#include <array>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cascade::tokenizer::internal {
namespace {

// Debian's abseil is built with its own string_view, so heterogeneous lookups need that type.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// byte -> code point of its byte-level spelling, and the inverse (code points < 512).
struct Alphabet {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 512> to_byte{};
  Alphabet() {
    to_byte.fill(-1);
    uint32_t shifted = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? b : shifted++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& GetAlphabet() {
  static const Alphabet* alphabet = new Alphabet();
  return *alphabet;
}

}  // namespace

std::optional<std::string> ByteLevelToBytes(std::string_view token) {
  const Alphabet& a = GetAlphabet();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const auto b0 = static_cast<uint8_t>(token[i]);
    uint32_t cp;
    if (b0 < 0x80) {
      cp = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < token.size()) {
      // The alphabet's code points are all below U+0200, i.e. at most two UTF-8 bytes.
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(token[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return std::nullopt;
    }
    if (cp >= a.to_byte.size() || a.to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(a.to_byte[cp]));
  }
  return out;
}

std::string BytesToByteLevel(std::string_view bytes) {
  const Alphabet& a = GetAlphabet();
  std::string out;
  for (char c : bytes) {
    const uint32_t cp = a.to_cp[static_cast<uint8_t>(c)];
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    absl::flat_hash_map<std::string, int32_t> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->ignore_merges_ = ignore_merges;
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(std::string(1, static_cast<char>(b)));
    if (it == vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("byte-level BPE vocab lacks the token for byte ", b));
    }
    m->byte_ids_[b] = it->second;
  }
  m->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto l = vocab.find(left);
    auto r = vocab.find(right);
    auto merged = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || merged == vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge ", rank, " (", BytesToByteLevel(left), " ", BytesToByteLevel(right),
                       ") refers to a token that is not in the vocab"));
    }
    // A duplicate merge keeps its first (best) rank, as HF does.
    m->merges_.try_emplace(PairKey(l->second, r->second),
                           Merge{static_cast<int32_t>(rank), merged->second});
  }
  m->vocab_ = std::move(vocab);
  return m;
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(AsAbsl(word));
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {
    out->push_back(byte_ids_[static_cast<uint8_t>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&mu_);
    auto it = cache_.find(AsAbsl(word));
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out->size();
  MergeWord(word, out);
  if (cacheable) {
    absl::MutexLock lock(&mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.try_emplace(std::string(word), out->begin() + static_cast<std::ptrdiff_t>(first),
                       out->end());
  }
}

void BpeModel::MergeWord(std::string_view word, std::vector<int32_t>* out) const {
  // Symbols form a linked list over the word's bytes; a merge folds the right symbol into the
  // left one and marks the right one dead (id -1).
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> syms(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    syms[i] = {byte_ids_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  // A candidate merge is (rank << 32 | left position) in a min-heap: lowest rank first, equal
  // ranks (the same pair twice) leftmost first, as HF does. 8-byte entries keep the heap
  // cache-friendly on long pieces (a 1 MB run of spaces is a single piece).
  auto candidate = [&](int32_t pos) -> std::optional<uint64_t> {
    if (pos < 0 || syms[pos].next < 0) return std::nullopt;
    auto it = merges_.find(PairKey(syms[pos].id, syms[syms[pos].next].id));
    if (it == merges_.end()) return std::nullopt;
    return (static_cast<uint64_t>(it->second.rank) << 32) | static_cast<uint32_t>(pos);
  };
  std::vector<uint64_t> heap;
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (std::optional<uint64_t> c = candidate(i)) heap.push_back(*c);
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  auto push = [&](int32_t pos) {
    if (std::optional<uint64_t> c = candidate(pos)) {
      heap.push_back(*c);
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const auto rank = static_cast<int32_t>(top >> 32);
    const auto pos = static_cast<int32_t>(top & 0xFFFFFFFFu);
    // Stale if either side has merged since it was queued: then the pair at `pos` is gone or
    // is a different pair, with a different rank (ranks are unique per pair).
    Symbol& left = syms[pos];
    if (left.id < 0 || left.next < 0) continue;
    Symbol& right = syms[left.next];
    auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.rank != rank) continue;
    left.id = it->second.new_id;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = pos;
    right.id = -1;
    push(left.prev);
    push(pos);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out->push_back(syms[i].id);
}

}  // namespace cascade::tokenizer::internal
