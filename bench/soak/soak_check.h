// The soak's verdict on its streams, as plain C++: every sample is sorted into completed (tokens
// equal to the cold reference), cancelled by the client (tokens so far a prefix of the
// reference), rejected (refused before a start message, by status code), lost (admitted, then an
// error or no finish) or wrong (tokens differ from the reference).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/service/loadgen_stats.h"

namespace cascade::bench {

struct SoakTally {
  int64_t requests = 0;   // samples seen
  int64_t admitted = 0;   // a start message came
  int64_t completed = 0;  // ended OK with exactly the reference's tokens
  int64_t cancelled = 0;  // cancelled by the client, tokens so far matching the reference
  int64_t lost = 0;       // admitted, not cancelled, then not a clean finish
  int64_t wrong = 0;      // tokens that differ from the reference (finished or cancelled)
  std::map<std::string, int64_t> rejected;  // refused before a start, by status code
  std::map<std::string, int64_t> lost_by;   // lost streams by status code (FINISH_ERROR, ...)
  std::vector<std::string> examples;        // the first few lost or wrong streams, described
  Percentiles ttft_ms;                      // over completed streams
  Percentiles e2e_ms;                       // over completed streams

  bool clean() const { return lost == 0 && wrong == 0; }
};

// Sorts `samples` (pool mode: each has a pool_index) against `references` (the cold token ids per
// pool index). A sample whose pool_index has no reference counts as wrong.
SoakTally TallySoak(const std::vector<RequestSample>& samples,
                    const std::vector<std::vector<int32_t>>& references);

// Splits samples into those a kill touched (in flight at a kill at `kill_s`, or sent within
// `settle_s` after one, while the stack recovers) and the others, keeping their order. Times are
// seconds from the phase's start (RequestSample::start_s); a sample without a start time counts as
// touched, so nothing unmeasured lands among the clean ones.
struct KillSplit {
  std::vector<RequestSample> touched;
  std::vector<RequestSample> clear;
};
KillSplit SplitByKills(const std::vector<RequestSample>& samples, const std::vector<double>& kill_s,
                       double settle_s);

// "3 of 40 tokens, first difference at 17 (got 5, want 9)" and the like.
std::string DescribeMismatch(const std::vector<int32_t>& got, const std::vector<int32_t>& want);

}  // namespace cascade::bench
