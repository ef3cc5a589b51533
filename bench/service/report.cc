// Report tables and the machine line; see report.h.
#include "bench/service/report.h"

#include <sys/utsname.h>

#include <fstream>
#include <map>
#include <ostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace cascade::bench {
namespace {

// The value after "key:" on the first line of a /proc file that starts with `key`.
std::string ProcField(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return "";
}

std::string Ratio(double hit, double miss) {
  if (miss <= 0 || hit <= 0) return "-";
  return absl::StrFormat("%.2fx", hit / miss);
}

std::string Ms(double v, int64_t count) { return count > 0 ? absl::StrFormat("%.1f", v) : "-"; }

}  // namespace

std::string DescribeMachine() {
  std::vector<std::string> parts;
  std::string cpu = ProcField("/proc/cpuinfo", "model name");
  parts.push_back(absl::StrCat(std::thread::hardware_concurrency(), " CPU",
                               cpu.empty() ? "" : absl::StrCat(" (", cpu, ")")));
  std::string mem = ProcField("/proc/meminfo", "MemTotal");  // "8048000 kB"
  int64_t kb = 0;
  if (absl::SimpleAtoi(absl::StripSuffix(mem, " kB"), &kb) && kb > 0) {
    parts.push_back(absl::StrFormat("%.1f GiB RAM", kb / 1048576.0));
  }
  utsname u{};
  if (uname(&u) == 0) parts.push_back(absl::StrCat(u.sysname, " ", u.release));
  return absl::StrJoin(parts, ", ");
}

std::string FormatErrors(const std::map<std::string, int64_t>& errors) {
  if (errors.empty()) return "-";
  std::vector<std::string> parts;
  for (const auto& [code, n] : errors) parts.push_back(absl::StrCat(code, ":", n));
  return absl::StrJoin(parts, " ");
}

void PrintReport(const std::vector<PhaseSummary>& phases, std::ostream& out) {
  out << "\n| conc | workload | requests | ok | req/s | out tok/s | prompt tok | cached frac "
         "| TTFT p50 ms | TTFT p90 | TTFT p99 | ITL p50 ms | ITL p90 | ITL p99 | errors | bound |\n"
         "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
         "| ---: | ---: | --- | --- |\n";
  for (const PhaseSummary& p : phases) {
    out << absl::StrFormat(
        "| %d | %s | %d | %d | %.2f | %.1f | %.0f | %.3f | %s | %s | %s | %s | %s | %s | %s | %s "
        "|\n",
        p.concurrency, p.workload, p.requests, p.ok, p.requests_per_s, p.output_tokens_per_s,
        p.mean_prompt_tokens, p.mean_cached_fraction, Ms(p.ttft_ms.p50, p.ttft_ms.count),
        Ms(p.ttft_ms.p90, p.ttft_ms.count), Ms(p.ttft_ms.p99, p.ttft_ms.count),
        Ms(p.itl_ms.p50, p.itl_ms.count), Ms(p.itl_ms.p90, p.itl_ms.count),
        Ms(p.itl_ms.p99, p.itl_ms.count), FormatErrors(p.errors), p.stopped_by);
  }

  // Pair each concurrency's hit phase with its miss phase (same run, same stack).
  std::map<int, const PhaseSummary*> miss, hit;
  for (const PhaseSummary& p : phases) (p.workload == "hit" ? hit : miss)[p.concurrency] = &p;
  bool header = false;
  for (const auto& [conc, h] : hit) {
    auto m = miss.find(conc);
    if (m == miss.end()) continue;
    if (!header) {
      out << "\nhit / miss (same run; < 1 is better for latency, > 1 for throughput):\n\n"
             "| conc | req/s | out tok/s | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 | ITL p90 "
             "| ITL p99 |\n"
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
      header = true;
    }
    const PhaseSummary& a = *h;
    const PhaseSummary& b = *m->second;
    out << absl::StrFormat("| %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", conc,
                           Ratio(a.requests_per_s, b.requests_per_s),
                           Ratio(a.output_tokens_per_s, b.output_tokens_per_s),
                           Ratio(a.ttft_ms.p50, b.ttft_ms.p50), Ratio(a.ttft_ms.p90, b.ttft_ms.p90),
                           Ratio(a.ttft_ms.p99, b.ttft_ms.p99), Ratio(a.itl_ms.p50, b.itl_ms.p50),
                           Ratio(a.itl_ms.p90, b.itl_ms.p90), Ratio(a.itl_ms.p99, b.itl_ms.p99));
  }
  out << "\nTTFT: request sent -> first token, at this client. ITL: gap between token arrivals "
         "after the first (a delta of k tokens counts k gaps of 1/k). cached frac: mean of "
         "usage.cached_tokens / prompt_tokens over ok requests.\n"
      << std::flush;
}

}  // namespace cascade::bench
