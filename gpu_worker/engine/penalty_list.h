// The penalties' listed tokens of a sequence (Sequence::listed_tokens): distinct ids in
// ascending order with their generated counts, kept up to date as tokens become known, and the
// same insertion applied to a row's copy in a ForwardBatch (the scheduler's FillPending).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "gpu_worker/engine/sequence.h"

namespace cascade::engine {

// Adds token t (generated or not) to the ascending list tokens[0, *n) with counts parallel (or
// null); both have room for one more.
inline void AddListed(int32_t* tokens, int32_t* counts, int32_t* n, int32_t t, bool generated) {
  int32_t* end = tokens + *n;
  int32_t* at = std::lower_bound(tokens, end, t);
  const size_t i = static_cast<size_t>(at - tokens);
  if (at == end || *at != t) {
    std::copy_backward(at, end, end + 1);
    *at = t;
    if (counts != nullptr) {
      std::copy_backward(counts + i, counts + *n, counts + *n + 1);
      counts[i] = 0;
    }
    ++*n;
  }
  if (counts != nullptr && generated) ++counts[i];
}

// Folds the sequence's known tokens since the last call (up to the first kPendingToken) into its
// listed tokens and counts: every token from output_start on, counted as generated, and the
// prompt's tokens (count 0) where the repetition penalty lists them. Calls added(token,
// generated) for each token folded in.
template <class F>
void AdvanceListed(Sequence* s, F&& added) {
  Sequence& seq = *s;
  const bool prompt = seq.sampling.repetition_penalty != 1.0f;  // the prompt's tokens are listed
  size_t end = seq.listed_upto;
  while (end < seq.tokens.size() && seq.tokens[end] != kPendingToken) ++end;
  const size_t begin = prompt ? seq.listed_upto : std::max(seq.listed_upto, seq.output_start);
  seq.listed_upto = end;
  if (begin >= end) return;
  std::vector<int32_t>& tokens = seq.listed_tokens;
  std::vector<int32_t>& counts = seq.listed_counts;
  constexpr size_t kOneByOne = 64;  // more at once (a prompt): sort them, then merge
  if (end - begin <= kOneByOne) {
    for (size_t i = begin; i < end; ++i) {
      const bool generated = i >= seq.output_start;
      tokens.push_back(0), counts.push_back(0);
      int32_t n = static_cast<int32_t>(tokens.size()) - 1;
      AddListed(tokens.data(), counts.data(), &n, seq.tokens[i], generated);
      tokens.resize(static_cast<size_t>(n)), counts.resize(static_cast<size_t>(n));
      added(seq.tokens[i], generated);
    }
    return;
  }
  std::vector<std::pair<int32_t, int32_t>> fresh;  // (token, generated count)
  fresh.reserve(end - begin + tokens.size());
  for (size_t i = begin; i < end; ++i) {
    fresh.emplace_back(seq.tokens[i], i >= seq.output_start ? 1 : 0);
    added(seq.tokens[i], i >= seq.output_start);
  }
  for (size_t j = 0; j < tokens.size(); ++j) fresh.emplace_back(tokens[j], counts[j]);
  std::sort(fresh.begin(), fresh.end());
  tokens.clear(), counts.clear();
  for (const auto& [t, c] : fresh) {
    if (!tokens.empty() && tokens.back() == t) {
      counts.back() += c;
    } else {
      tokens.push_back(t), counts.push_back(c);
    }
  }
}

}  // namespace cascade::engine
