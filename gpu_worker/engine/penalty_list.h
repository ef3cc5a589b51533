// A row's listed tokens (sample_rule.h step 1; Sequence::listed_tokens): distinct ids in
// ascending order with their generated counts and logit biases, kept up to date as tokens become
// known, and the same insertion applied to a row's copy in a ForwardBatch (the scheduler's
// FillPending). A token is listed when the request biases it (count -1 until it occurs in the
// history), when it was generated (counted), and, for the repetition penalty, when it is in the
// prompt (count 0 unless also generated).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <tuple>
#include <vector>

#include "gpu_worker/engine/sequence.h"
#include "gpu_worker/engine/types.h"

namespace cascade::engine {

// True when a request's penalties list tokens of its history (prompt or generated ones).
inline bool ListsHistory(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}
// True when a request's rows carry listed tokens at all.
inline bool HasListed(const SamplingParams& p) { return ListsHistory(p) || !p.logit_bias.empty(); }

// min_tokens (types.h): the ids a request's first min_tokens generated tokens may not be (the
// model's EOS ids unless ignore_eos, and its stop_token_ids), ascending and distinct, within the
// vocabulary; empty where min_tokens is 0.
inline std::vector<int32_t> StopBanOf(const SamplingParams& p, std::span<const int32_t> eos,
                                      int vocab) {
  std::vector<int32_t> ban;
  if (p.min_tokens <= 0) return ban;
  if (!p.ignore_eos) ban.assign(eos.begin(), eos.end());
  ban.insert(ban.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  std::erase_if(ban, [vocab](int32_t t) { return t < 0 || t >= vocab; });
  std::sort(ban.begin(), ban.end());
  ban.erase(std::unique(ban.begin(), ban.end()), ban.end());
  return ban;
}

// Lists the banned ids among the request's biased tokens (bias 0 where it gives none), so that
// every step's list holds them and a banning step only sets their bias (ApplyBan). Keeps
// logit_bias ascending and distinct.
inline void ListBanned(std::span<const int32_t> ban, SamplingParams* p) {
  auto& bias = p->logit_bias;
  const auto by_id = [](const auto& a, const auto& b) { return a.first < b.first; };
  const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(bias.size());
  for (const int32_t t : ban) {
    const auto at = std::lower_bound(bias.begin(), bias.begin() + n, std::pair{t, 0.0f}, by_id);
    if (at == bias.begin() + n || at->first != t) bias.emplace_back(t, 0.0f);
  }
  std::inplace_merge(bias.begin(), bias.begin() + n, bias.end(), by_id);
}

// Whether the token that `seq` samples at `position` is banned from being a stop id: one of
// this attempt's first min_tokens.
inline bool Banning(const Sequence& seq, int64_t position) {
  return !seq.stop_ban.empty() && position - seq.prompt_len < seq.sampling.min_tokens;
}

// A banning step's list: the banned ids' biases in a row's list (tokens[0, n) ascending, biases
// parallel; every banned id is listed, ListBanned) become -inf (sample_rule.h step 1: the
// token's value is then -inf, never kept or drawn while any other token is finite).
inline void ApplyBan(std::span<const int32_t> ban, const int32_t* tokens, float* bias, int32_t n) {
  const int32_t* end = tokens + n;
  for (const int32_t t : ban) {
    const int32_t* at = std::lower_bound(tokens, end, t);
    if (at != end && *at == t) bias[at - tokens] = -std::numeric_limits<float>::infinity();
  }
}

// The request's parameters as a banning step samples them on the host: the banned ids' biases
// -inf (the same list the batch's copy holds after ApplyBan).
inline SamplingParams BannedParams(const SamplingParams& p, std::span<const int32_t> ban) {
  SamplingParams b = p;
  for (auto& [t, bias] : b.logit_bias) {
    if (std::binary_search(ban.begin(), ban.end(), t))
      bias = -std::numeric_limits<float>::infinity();
  }
  return b;
}

// Adds token t of the history (generated or not) to the ascending list tokens[0, *n) with counts
// and biases parallel (either may be null); each has room for one more. A new entry has bias 0;
// an entry listed for its bias alone (count -1) joins the history.
inline void AddListed(int32_t* tokens, int32_t* counts, float* bias, int32_t* n, int32_t t,
                      bool generated) {
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
    if (bias != nullptr) {
      std::copy_backward(bias + i, bias + *n, bias + *n + 1);
      bias[i] = 0.0f;
    }
    ++*n;
  }
  if (counts != nullptr && counts[i] < 0) counts[i] = 0;
  if (counts != nullptr && generated) ++counts[i];
}

// Merges history tokens `fresh` (token, generated?) into the ascending lists (tokens, counts,
// bias; bias may be empty): the rule of AddListed for each, in one sort.
inline void MergeListed(std::vector<std::pair<int32_t, bool>> fresh, std::vector<int32_t>* tokens,
                        std::vector<int32_t>* counts, std::vector<float>* bias) {
  // (token, 0: a listed entry / 1: a history token, count or generated, bias)
  std::vector<std::tuple<int32_t, int, int32_t, float>> all;
  all.reserve(fresh.size() + tokens->size());
  for (size_t j = 0; j < tokens->size(); ++j) {
    all.emplace_back((*tokens)[j], 0, (*counts)[j], bias->empty() ? 0.0f : (*bias)[j]);
  }
  for (const auto& [t, generated] : fresh) all.emplace_back(t, 1, generated ? 1 : 0, 0.0f);
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  const bool biased = !bias->empty();
  tokens->clear(), counts->clear(), bias->clear();
  for (const auto& [t, kind, c, b] : all) {
    if (tokens->empty() || tokens->back() != t) {
      tokens->push_back(t), counts->push_back(-1);
      if (biased) bias->push_back(0.0f);
    }
    if (kind == 0 && biased) bias->back() = b;
    if (c >= 0) counts->back() = std::max(counts->back(), 0) + c;  // (-1: a bias alone)
  }
}

// The listed entries a request starts with: its biased tokens (count -1).
inline void StartListed(const SamplingParams& p, std::vector<int32_t>* tokens,
                        std::vector<int32_t>* counts, std::vector<float>* bias) {
  tokens->clear(), counts->clear(), bias->clear();
  for (const auto& [t, b] : p.logit_bias) {
    tokens->push_back(t), counts->push_back(-1), bias->push_back(b);
  }
}

// The whole list of a row at once: history[0, output_start) the prompt, the rest generated.
inline void ListedOf(const SamplingParams& p, std::span<const int32_t> history, size_t output_start,
                     std::vector<int32_t>* tokens, std::vector<int32_t>* counts,
                     std::vector<float>* bias) {
  StartListed(p, tokens, counts, bias);
  if (!ListsHistory(p)) return;
  std::vector<std::pair<int32_t, bool>> fresh;
  const size_t begin = p.repetition_penalty != 1.0f ? 0 : std::min(output_start, history.size());
  for (size_t i = begin; i < history.size(); ++i) fresh.emplace_back(history[i], i >= output_start);
  MergeListed(std::move(fresh), tokens, counts, bias);
}

// Folds the sequence's known tokens since the last call (up to the first kPendingToken) into its
// listed tokens: every token from output_start on, counted as generated, and the prompt's tokens
// (count 0) where the repetition penalty lists them. Calls added(token, generated) for each token
// folded in. A request without penalties keeps its biased tokens alone.
template <class F>
void AdvanceListed(Sequence* s, F&& added) {
  Sequence& seq = *s;
  size_t end = seq.listed_upto;
  while (end < seq.tokens.size() && seq.tokens[end] != kPendingToken) ++end;
  if (!ListsHistory(seq.sampling)) {
    seq.listed_upto = end;
    return;
  }
  const bool prompt = seq.sampling.repetition_penalty != 1.0f;  // the prompt's tokens are listed
  const size_t begin = prompt ? seq.listed_upto : std::max(seq.listed_upto, seq.output_start);
  seq.listed_upto = end;
  if (begin >= end) return;
  std::vector<int32_t>& tokens = seq.listed_tokens;
  std::vector<int32_t>& counts = seq.listed_counts;
  std::vector<float>& bias = seq.listed_bias;
  const bool biased = !seq.sampling.logit_bias.empty();
  constexpr size_t kOneByOne = 64;  // more at once (a prompt): sort them, then merge
  if (end - begin <= kOneByOne) {
    for (size_t i = begin; i < end; ++i) {
      const bool generated = i >= seq.output_start;
      tokens.push_back(0), counts.push_back(0);
      if (biased) bias.push_back(0.0f);
      int32_t n = static_cast<int32_t>(tokens.size()) - 1;
      AddListed(tokens.data(), counts.data(), biased ? bias.data() : nullptr, &n, seq.tokens[i],
                generated);
      tokens.resize(static_cast<size_t>(n)), counts.resize(static_cast<size_t>(n));
      if (biased) bias.resize(static_cast<size_t>(n));
      added(seq.tokens[i], generated);
    }
    return;
  }
  std::vector<std::pair<int32_t, bool>> fresh;
  fresh.reserve(end - begin);
  for (size_t i = begin; i < end; ++i) {
    fresh.emplace_back(seq.tokens[i], i >= seq.output_start);
    added(seq.tokens[i], i >= seq.output_start);
  }
  MergeListed(std::move(fresh), &tokens, &counts, &bias);
}

}  // namespace cascade::engine
