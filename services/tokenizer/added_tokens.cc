// Added-token splitting with HF's lstrip/rstrip semantics.
#include "services/tokenizer/added_tokens.h"

#include <utf8proc.h>

#include <algorithm>

namespace cascade::tokenizer::internal {
namespace {

// Unicode White_Space, which is what Rust's char::is_whitespace (HF's test) checks.
bool IsWhitespace(utf8proc_int32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85) return true;
  if (cp < 0x80) return false;
  const utf8proc_category_t cat = utf8proc_category(cp);
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

// Length of the whitespace run that starts at text[pos].
size_t WhitespaceAfter(std::string_view text, size_t pos) {
  size_t i = pos;
  while (i < text.size()) {
    utf8proc_int32_t cp;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                    static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
    if (n <= 0 || !IsWhitespace(cp)) break;
    i += static_cast<size_t>(n);
  }
  return i - pos;
}

// Length of the whitespace run that ends at text[end - 1], not reaching before `floor`.
size_t WhitespaceBefore(std::string_view text, size_t floor, size_t end) {
  size_t i = end;
  while (i > floor) {
    size_t start = i - 1;
    while (start > floor && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    utf8proc_int32_t cp;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + start),
                                    static_cast<utf8proc_ssize_t>(i - start), &cp);
    if (n <= 0 || !IsWhitespace(cp)) break;
    i = start;
  }
  return end - i;
}

}  // namespace

AddedTokenSplitter::AddedTokenSplitter(const std::vector<const AddedToken*>& tokens) {
  for (const AddedToken* t : tokens) {
    if (t->content.empty()) continue;
    by_first_byte_[static_cast<uint8_t>(t->content[0])].push_back(t);
  }
  for (auto& [byte, list] : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->content.size() > b->content.size();
    });
  }
}

void AddedTokenSplitter::Split(std::string_view text, std::vector<Segment>* out) const {
  size_t text_start = 0;  // start of the pending text segment
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* match = nullptr;
    if (auto it = by_first_byte_.find(static_cast<uint8_t>(text[pos]));
        it != by_first_byte_.end()) {
      for (const AddedToken* t : it->second) {
        if (text.substr(pos).starts_with(t->content)) {
          match = t;
          break;
        }
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos;
    size_t end = pos + match->content.size();
    if (match->lstrip) begin -= WhitespaceBefore(text, text_start, begin);
    if (match->rstrip) end += WhitespaceAfter(text, end);
    if (begin > text_start) out->push_back({text.substr(text_start, begin - text_start), -1});
    out->push_back({text.substr(pos, match->content.size()), match->id});
    text_start = pos = end;
  }
  if (text_start < text.size()) out->push_back({text.substr(text_start), -1});
}

}  // namespace cascade::tokenizer::internal
