// Classifying soak streams against their references; see soak_check.h.
#include "bench/soak/soak_check.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace cascade::bench {
namespace {

constexpr size_t kMaxExamples = 10;

bool IsPrefix(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  return got.size() <= want.size() && std::equal(got.begin(), got.end(), want.begin());
}

}  // namespace

std::string DescribeMismatch(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::string out = absl::StrCat(got.size(), " tokens (reference ", want.size(), ")");
  if (i < got.size() && i < want.size()) {
    absl::StrAppend(&out, ", first difference at ", i, " (got ", got[i], ", want ", want[i], ")");
  } else {
    absl::StrAppend(&out, ", equal over the first ", i);
  }
  return out;
}

KillSplit SplitByKills(const std::vector<RequestSample>& samples, const std::vector<double>& kill_s,
                       double settle_s) {
  KillSplit out;
  for (const RequestSample& s : samples) {
    bool touched = s.start_s < 0 || s.e2e_ms < 0;
    const double end_s = s.start_s + s.e2e_ms / 1000.0;
    for (double k : kill_s) {
      if (touched) break;
      touched = s.start_s <= k + settle_s && end_s >= k;
    }
    (touched ? out.touched : out.clear).push_back(s);
  }
  return out;
}

SoakTally TallySoak(const std::vector<RequestSample>& samples,
                    const std::vector<std::vector<int32_t>>& references) {
  SoakTally t;
  std::vector<double> ttft, e2e;
  auto example = [&t](std::string line) {
    if (t.examples.size() < kMaxExamples) t.examples.push_back(std::move(line));
  };
  for (const RequestSample& s : samples) {
    ++t.requests;
    if (s.admitted) ++t.admitted;
    const bool has_reference =
        s.pool_index >= 0 && static_cast<size_t>(s.pool_index) < references.size();
    if (!has_reference) {
      ++t.wrong;
      example(absl::StrCat("request without a reference (pool index ", s.pool_index, ")"));
      continue;
    }
    const std::vector<int32_t>& want = references[static_cast<size_t>(s.pool_index)];
    if (s.cancelled) {
      if (IsPrefix(s.token_ids, want)) {
        ++t.cancelled;
      } else {
        ++t.wrong;
        example(absl::StrCat("wrong (cancelled) pool #", s.pool_index, ": ",
                             DescribeMismatch(s.token_ids, want)));
      }
      continue;
    }
    if (s.ok) {
      if (s.token_ids == want) {
        ++t.completed;
        if (s.ttft_ms >= 0) ttft.push_back(s.ttft_ms);
        if (s.e2e_ms >= 0) e2e.push_back(s.e2e_ms);
      } else {
        ++t.wrong;
        example(
            absl::StrCat("wrong pool #", s.pool_index, ": ", DescribeMismatch(s.token_ids, want)));
      }
      continue;
    }
    const std::string code = s.error_code.empty() ? "UNKNOWN" : s.error_code;
    if (!s.admitted) {
      ++t.rejected[code];
      continue;
    }
    ++t.lost;
    ++t.lost_by[code];
    if (!IsPrefix(s.token_ids, want)) ++t.wrong;  // also wrong before it broke off
    example(absl::StrCat("lost pool #", s.pool_index, ": ", code, " after ", s.token_ids.size(),
                         " of ", want.size(), " tokens"));
  }
  t.ttft_ms = ComputePercentiles(std::move(ttft));
  t.e2e_ms = ComputePercentiles(std::move(e2e));
  return t;
}

}  // namespace cascade::bench
