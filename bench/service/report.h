// The load generator's report: one Markdown table row per phase (workload x concurrency), then
// hit/miss ratios per concurrency from the same run, and a line describing this machine.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "bench/service/loadgen_stats.h"

namespace cascade::bench {

// "2 x AMD EPYC ... , 7.7 GiB RAM, Linux 6.1" from /proc; parts that cannot be read are left out.
std::string DescribeMachine();

// Writes the phase table and the ratio table (Markdown, so it pastes into RESULTS.md as is).
void PrintReport(const std::vector<PhaseSummary>& phases, std::ostream& out);

// "UNAVAILABLE:2 DEADLINE_EXCEEDED:1", or "-" when there were none.
std::string FormatErrors(const std::map<std::string, int64_t>& errors);

}  // namespace cascade::bench
