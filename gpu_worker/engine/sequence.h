// One request's state inside the engine: its tokens, KV block table and progress.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/chunk_hash.h"
#include "gpu_worker/engine/eviction.h"
#include "gpu_worker/engine/types.h"

namespace cascade::engine {

enum class SeqState { kWaiting, kRunning, kFinished };

// Stands for a token a step in flight is sampling (overlapped schedule); never sent to a backend.
constexpr int32_t kPendingToken = -1;

struct Sequence {
  uint64_t id = 0;
  std::string request_id;
  SamplingParams sampling;
  uint64_t seed = 0;
  int64_t pin_ttl_ms = 0;
  EvictionHints hints;  // for the prompt's blocks

  std::vector<int32_t> tokens;  // prompt then generated; the last one may not be in the KV yet
  int64_t prompt_len = 0;
  std::vector<hash::PlacedChunk> chunks;  // chained hashes and positions of the prompt's chunks
  std::vector<int32_t> chunk_kinds;       // parallel to chunks
  hash::Hash128 tail_salt;                // salt state for tokens after the prompt

  // Keys of full blocks: the prompt's precomputed, generated ones appended as blocks fill.
  std::vector<hash::Hash128> block_keys;
  std::vector<int32_t> block_table;  // physical block per logical block
  int64_t num_computed = 0;          // fill length: tokens whose K/V are in the cache
  int64_t num_committed = 0;         // leading blocks whose key is registered in the cache

  // Blocks fetched from a peer, written into the host tier before admission (peer_next of them
  // so far); emptied once they are.
  std::vector<PeerBlock> peer_blocks;
  size_t peer_next = 0;

  SeqState state = SeqState::kWaiting;
  bool started = false;       // the start output (cached tokens) was emitted
  int64_t cached_tokens = 0;  // prefix-cache hit at first admission
  int32_t num_generated = 0;
  // SamplingParams::prompt_logprobs >= 0: the next prompt token whose logprob is still to be
  // emitted (the logits row at position prompt_logprobs_next - 1 scores it).
  int64_t prompt_logprobs_next = 1;
  int64_t arrival = 0;              // admission order, for FIFO and preemption choice
  bool pinned = false;              // pins taken (once, after the prompt's prefill)
  int64_t reported_committed = -1;  // num_committed when residency last looked
  int prefix_waits = 0;             // steps it waited for a running sequence's prefix (scheduler)

  // The listed tokens (sample_rule.h step 1; penalty_list.h): distinct ids in ascending order,
  // each with how often it was generated (tokens from `output_start` on) and its logit bias;
  // biased tokens are listed from the start (count -1 until they occur in the history), prompt
  // tokens (count 0 unless also generated) only for the repetition penalty. Kept up to date
  // incrementally by the scheduler (only for requests with a penalty or a bias), so a step costs
  // O(list) for its copy into the batch, not a pass over the context.
  std::vector<int32_t> listed_tokens;
  std::vector<int32_t> listed_counts;  // parallel
  std::vector<float> listed_bias;      // parallel where the request has a logit_bias, else empty
  size_t listed_upto = 0;              // tokens[0, listed_upto) are folded in
  // min_tokens (types.h): the stop ids banned while the token sampled is one of this attempt's
  // first sampling.min_tokens (StopBanOf); listed among the biased tokens from the start, so a
  // banning step sets their bias to -inf in its copy of the list (penalty_list.h ApplyBan).
  std::vector<int32_t> stop_ban;
  // tokens[output_start, ...) count as generated: the prompt's length, less the tokens an
  // earlier attempt generated when this is a resumed stream (Request::resumed_tokens).
  size_t output_start = 0;

  // Overlapped schedule (EngineOptions::overlap_schedule): tokens[0, num_computed) whose K/V a
  // step still in flight is computing (not yet committed), and whether that step's token is
  // this sequence's last (max_tokens or the context limit), so nothing is scheduled after it.
  // While a step that samples this sequence is in flight, tokens.back() is kPendingToken.
  int64_t inflight_tokens = 0;
  bool last_token_in_flight = false;

  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - num_computed; }
  // Prompt logprobs still to compute: rows from position prompt_logprobs_next - 1 up to the
  // prompt's second-last token.
  bool WantsPromptRows() const {
    return sampling.prompt_logprobs >= 0 && prompt_logprobs_next < prompt_len;
  }
};

}  // namespace cascade::engine
