// Helpers for engine tests: build an engine over a backend and run requests to completion.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "gpu_worker/engine/engine.h"

namespace cascade::engine::testing {

struct Result {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  std::vector<LogprobEntry> logprobs;         // when the request asked for them
  std::vector<LogprobEntry> prompt_logprobs;  // from prompt token 1, when asked for
  FinishReason finish = FinishReason::kNone;
  int32_t stop_token_id = -1;
  int64_t cached_tokens = -1;
  int64_t prompt_tokens = -1;
  std::vector<ChunkPlacement> chunks;
  absl::Status status;  // the final output's
};

// Adds every request, steps until all finish (bounded), returns results in request order.
inline std::vector<Result> RunAll(Engine& engine, const std::vector<Request>& requests,
                                  int max_steps = 100000) {
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = engine.AddRequest(requests[i]);
    EXPECT_TRUE(id.ok()) << id.status();
    if (id.ok()) index[*id] = i;
  }
  std::vector<Result> results(requests.size());
  size_t done = 0;
  for (int step = 0; step < max_steps && done < index.size(); ++step) {
    auto outs = engine.Step();
    EXPECT_TRUE(outs.ok()) << outs.status();
    if (!outs.ok()) break;
    for (SequenceOutput& o : *outs) {
      Result& r = results[index.at(o.seq_id)];
      if (o.started) {
        r.cached_tokens = o.cached_tokens;
        r.prompt_tokens = o.prompt_tokens;
        r.chunks = o.chunks;
      }
      r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      for (auto& l : o.logits) r.logits.push_back(std::move(l));
      r.logprobs.insert(r.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      if (!o.prompt_logprobs.empty()) {  // in order, none twice
        EXPECT_EQ(o.prompt_logprobs_start, 1 + static_cast<int64_t>(r.prompt_logprobs.size()));
      }
      r.prompt_logprobs.insert(r.prompt_logprobs.end(), o.prompt_logprobs.begin(),
                               o.prompt_logprobs.end());
      if (o.finished) {
        r.finish = o.finish_reason;
        r.stop_token_id = o.stop_token_id;
        r.status = o.status;
        ++done;
      }
    }
  }
  EXPECT_EQ(done, index.size()) << "requests did not finish within the step bound";
  return results;
}

// Makes each request in `which` stop on the token a run of all `requests` on `ref` gave it at
// index 3 (the stop then fires there, or earlier where that token came before). Call it under
// ASSERT_NO_FATAL_FAILURE: a request that ran fewer than 4 tokens fails the test.
inline void StopAtFourthToken(Engine& ref, std::vector<Request>& requests,
                              std::initializer_list<int> which) {
  const std::vector<Result> first = RunAll(ref, requests);
  for (int i : which) {
    ASSERT_GT(first[i].tokens.size(), 3u) << "request " << i;
    requests[i].sampling.stop_token_ids = {first[i].tokens[3]};
  }
}

inline Result RunOne(Engine& engine, const Request& r) { return RunAll(engine, {r})[0]; }

// A prompt of random chunks; lengths in [1, max_len]; kinds cycle SYSTEM, CONTEXT, QUERY.
inline Request RandomRequest(std::mt19937& rng, int vocab, int num_chunks, int max_len,
                             int max_tokens) {
  Request r;
  std::uniform_int_distribution<int> tok(0, vocab - 1), len(1, max_len);
  for (int c = 0; c < num_chunks; ++c) {
    ChunkInput ci;
    ci.kind = 1 + c % 3;
    int n = len(rng);
    for (int i = 0; i < n; ++i) ci.tokens.push_back(tok(rng));
    r.chunks.push_back(std::move(ci));
  }
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// A logit_bias of `n` entries (OpenAI's): the prompt's first token and random ids, with biases
// that decide tokens (+4, -100) or only shift them (0.7, -1.5).
inline std::vector<std::pair<int32_t, float>> RandomLogitBias(std::mt19937& rng, int vocab,
                                                              const Request& r, int n) {
  std::map<int32_t, float> bias;
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  const float values[] = {4.0f, -100.0f, 0.7f, -1.5f};
  for (int k = 0; k < n; ++k) {
    bias[k == 0 ? r.chunks[0].tokens[0] : tok(rng)] = values[k % 4];
  }
  return {bias.begin(), bias.end()};
}

// A request of one chunk of `len` random tokens.
inline Request OneChunkRequest(std::mt19937& rng, int vocab, int len, int max_tokens) {
  Request r = RandomRequest(rng, vocab, 1, 1, max_tokens);
  r.chunks[0].tokens.resize(len);
  for (auto& t : r.chunks[0].tokens) t = static_cast<int32_t>(rng() % vocab);
  return r;
}

// What a client saw of one request.
struct Seen {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // sampled and top values, in order
  std::vector<int32_t> logprob_ids;
  FinishReason finish = FinishReason::kNone;
  int32_t stop_token_id = -1;
  bool operator==(const Seen&) const = default;
};

// Drives an engine the way a client would: the first half of `reqs` up front, the rest once 12
// tokens have been seen; request 1 cancelled once it has shown 4 tokens; request 0's chunks
// evicted once it has finished. Every trigger depends only on what the client has seen, so an
// engine with and without overlap must show the same.
inline std::vector<Seen> RunScripted(Engine& e, const std::vector<Request>& reqs) {
  std::map<uint64_t, size_t> index;
  auto add = [&](size_t i) {
    auto id = e.AddRequest(reqs[i]);
    ASSERT_TRUE(id.ok()) << id.status();
    index[*id] = i;
  };
  const size_t half = reqs.size() / 2;
  for (size_t i = 0; i < half; ++i) add(i);
  std::vector<Seen> seen(reqs.size());
  std::vector<hash::Hash128> chunks0;
  size_t total = 0, done = 0;
  bool added = false, cancelled = false;
  for (int step = 0; step < 10000 && done < reqs.size(); ++step) {
    auto outs = e.Step();
    EXPECT_TRUE(outs.ok()) << outs.status();
    if (!outs.ok()) break;
    for (const SequenceOutput& o : *outs) {
      const size_t i = index.at(o.seq_id);
      Seen& r = seen[i];
      if (o.started && i == 0) {
        for (const ChunkPlacement& c : o.chunks) chunks0.push_back(c.hash);
      }
      r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      total += o.new_tokens.size();
      for (const LogprobEntry& l : o.logprobs) {
        r.logprobs.push_back(l.sampled.logprob);
        for (const TokenLogprob& t : l.top) {
          r.logprobs.push_back(t.logprob);
          r.logprob_ids.push_back(t.token_id);
        }
      }
      EXPECT_TRUE(o.status.ok()) << o.status;
      if (o.finished) {
        r.finish = o.finish_reason;
        r.stop_token_id = o.stop_token_id;
        ++done;
        if (i == 0) e.EvictChunks(chunks0);
      }
    }
    if (!added && total >= 12) {
      for (size_t i = half; i < reqs.size(); ++i) add(i);
      added = true;
    }
    for (const auto& [id, i] : index) {
      if (i == 1 && !cancelled && seen[1].tokens.size() >= 4) {
        e.Cancel(id);
        cancelled = true;
      }
    }
  }
  EXPECT_EQ(done, reqs.size());
  return seen;
}

}  // namespace cascade::engine::testing
