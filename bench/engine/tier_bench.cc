// KV beyond one GPU's memory: a working set of tenant prefixes larger than the GPU tier, cycled,
// with the host KV tier on and off in the same run (issue 13). Engine level, no gRPC.
//
//   tier_bench [--backend=cpu|cuda] [--preset=tiny|qwen3-0.6b|...] [--tenants=64]
//              [--system_len=4096] [--query_len=32] [--gen=8] [--rounds=3] [--concurrency=4]
//              [--gpu_fraction=0.25] [--block_size=16] [--host=off,on,...] [--seed=0]
//
// --host: the settings run, in order: off, on (the host tier with its copies ahead of eviction,
// the default), on-noahead (the host tier copying each block at its eviction instead),
// on-selective (the write policy --host_kv_offload_min_uses=1: only blocks taken again while
// cached go to the host; here, where a tenant comes back only after its eviction, none does:
// the policy's cost, as a measurement).
//
// Each tenant owns a system chunk of system_len random tokens; a request is a tenant's system
// chunk plus a fresh query of query_len tokens, generating gen tokens (greedy). Requests go
// tenant 0, 1, ..., tenants - 1, then again, for `rounds` rounds, `concurrency` in flight
// (closed loop). The GPU tier holds gpu_fraction of the working set (tenants x system_len); the
// host tier, when on, holds all of it. Reported per setting: prefix hit rate (prompt tokens
// found in either tier / looked up), of which from the host, TTFT p50/p99 (AddRequest to the
// step that returned the first token), throughput, and the first round (all cold) separately.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gpu_worker/backend/cpu/cpu_backend.h"
#include "gpu_worker/engine/engine.h"
#include "gpu_worker/model/generator.h"
#include "gpu_worker/model/model.h"
#ifdef CASCADE_HAVE_CUDA
#include "gpu_worker/backend/cuda/cuda_backend.h"
#include "gpu_worker/backend/cuda/device.h"
#endif

namespace cascade::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string backend = "cpu";
  std::string preset = "tiny";
  int tenants = 64, system_len = 4096, query_len = 32, gen = 8, rounds = 3, concurrency = 4;
  int block_size = 16, seed = 0;
  double gpu_fraction = 0.25;
  std::vector<std::string> host = {"off", "on"};
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "bad argument %s (want --name=value)\n", a.c_str());
      return false;
    }
    const std::string k = a.substr(2, eq - 2), v = a.substr(eq + 1);
    std::map<std::string, int*> ints = {
        {"tenants", &f->tenants},       {"system_len", &f->system_len},
        {"query_len", &f->query_len},   {"gen", &f->gen},
        {"rounds", &f->rounds},         {"concurrency", &f->concurrency},
        {"block_size", &f->block_size}, {"seed", &f->seed}};
    bool ok = true;
    if (auto it = ints.find(k); it != ints.end()) {
      ok = absl::SimpleAtoi(v, it->second) && (*it->second > 0 || k == "seed");
    } else if (k == "backend") {
      f->backend = v;
      ok = v == "cpu" || v == "cuda";
    } else if (k == "preset") {
      f->preset = v;
    } else if (k == "gpu_fraction") {
      ok = absl::SimpleAtod(v, &f->gpu_fraction) && f->gpu_fraction > 0 && f->gpu_fraction <= 1;
    } else if (k == "host") {
      f->host = absl::StrSplit(v, ',');
      for (const std::string& h : f->host) {
        ok = ok && (h == "on" || h == "off" || h == "on-noahead" || h == "on-selective");
      }
    } else {
      std::fprintf(stderr, "unknown flag --%s\n", k.c_str());
      return false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad value for --%s: %s\n", k.c_str(), v.c_str());
      return false;
    }
  }
  return true;
}

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

std::unique_ptr<engine::Backend> MakeBackend(const Flags& f, const model::Model& m,
                                             int64_t blocks) {
  if (f.backend == "cpu") {
    cpu::CpuBackendOptions o;
    o.num_blocks = blocks;
    o.block_size = f.block_size;
    return cpu::NewCpuBackend(m, o);
  }
#ifdef CASCADE_HAVE_CUDA
  cuda::CudaBackendOptions o;
  o.num_blocks = blocks;
  o.block_size = f.block_size;
  o.max_num_tokens = 8192;
  auto b = cuda::NewCudaBackend(m, o);
  if (!b.ok()) {
    std::fprintf(stderr, "cuda backend: %s\n", b.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*b);
#else
  std::fprintf(stderr, "built without CUDA; use --backend=cpu\n");
  return nullptr;
#endif
}

struct RunResult {
  std::vector<double> ttft_ms, ttft_cold_ms;  // rounds after the first; the first round
  double seconds = 0;
  int64_t output_tokens = 0;
  engine::EngineStats stats;
};

RunResult Run(const Flags& f, const model::Model& m, const std::string& host) {
  const bool host_on = host != "off";
  const int64_t bs = f.block_size;
  const int64_t set_blocks = int64_t{f.tenants} * ((f.system_len + bs - 1) / bs);
  const int64_t request_blocks = (f.system_len + f.query_len + f.gen + bs - 1) / bs;
  const int64_t gpu_blocks =
      std::max<int64_t>(static_cast<int64_t>(f.gpu_fraction * static_cast<double>(set_blocks)),
                        request_blocks * f.concurrency);
  std::unique_ptr<engine::Backend> backend = MakeBackend(f, m, gpu_blocks);
  if (!backend) std::exit(1);
  engine::EngineOptions eo;
  eo.model_name = m.name();
  eo.max_num_seqs = std::max(f.concurrency, 1);
  eo.max_num_batched_tokens = 8192;
  eo.max_context = f.system_len + f.query_len + f.gen + 1;
  eo.max_waiting = 100000;
  eo.host_kv_bytes =
      host_on ? (set_blocks + request_blocks * f.concurrency) * backend->KvBlockBytes() : 0;
  if (host == "on-noahead") eo.host_offload_ahead_blocks = 0;
  if (host == "on-selective") eo.host_offload_min_uses = 1;
  auto e = engine::NewEngine(eo, std::move(backend));
  if (!e->HostTierStatus().ok()) {
    std::fprintf(stderr, "host tier: %s\n", e->HostTierStatus().ToString().c_str());
    std::exit(1);
  }

  std::mt19937 rng(static_cast<uint32_t>(f.seed));
  const int vocab = static_cast<int>(m.config().vocab_size);
  auto tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
    return t;
  };
  std::vector<std::vector<int32_t>> systems;
  for (int t = 0; t < f.tenants; ++t) systems.push_back(tokens(f.system_len));

  RunResult out;
  const int total = f.tenants * f.rounds;
  int next = 0, done = 0;
  struct Live {
    Clock::time_point start;
    bool first_round = false;
    bool got_first = false;
  };
  std::map<uint64_t, Live> live;
  const auto t0 = Clock::now();
  while (done < total) {
    while (next < total && static_cast<int>(live.size()) < f.concurrency) {
      engine::Request r;
      r.chunks.push_back({1, systems[next % f.tenants], ""});
      r.chunks.push_back({3, tokens(f.query_len), ""});
      r.sampling.max_tokens = f.gen;
      r.sampling.ignore_eos = true;
      auto id = e->AddRequest(std::move(r));
      if (!id.ok()) {
        std::fprintf(stderr, "AddRequest: %s\n", id.status().ToString().c_str());
        std::exit(1);
      }
      live[*id] = Live{Clock::now(), next < f.tenants, false};
      ++next;
    }
    auto outs = e->Step();
    if (!outs.ok()) {
      std::fprintf(stderr, "Step: %s\n", outs.status().ToString().c_str());
      std::exit(1);
    }
    const auto now = Clock::now();
    for (const engine::SequenceOutput& o : *outs) {
      auto it = live.find(o.seq_id);
      if (it == live.end()) continue;
      out.output_tokens += static_cast<int64_t>(o.new_tokens.size());
      if (!it->second.got_first && !o.new_tokens.empty()) {
        it->second.got_first = true;
        (it->second.first_round ? out.ttft_cold_ms : out.ttft_ms)
            .push_back(Ms(it->second.start, now));
      }
      if (o.finished) {
        if (!o.status.ok()) {
          std::fprintf(stderr, "request failed: %s\n", o.status.ToString().c_str());
          std::exit(1);
        }
        live.erase(it);
        ++done;
      }
    }
  }
  out.seconds = Ms(t0, Clock::now()) / 1000.0;
  out.stats = e->Stats();
  return out;
}

int Main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  auto config = model::FindPresetConfig(f.preset);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 2;
  }
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("cascade_bench_" + f.preset)).string();
  if (!std::filesystem::exists(dir + "/config.json")) {
    if (absl::Status st = model::WriteRandomModel(dir, *config, 0, ""); !st.ok()) {
      std::fprintf(stderr, "mkmodel: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  auto m = model::LoadModel(dir);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
    return 1;
  }
  std::string device = "cpu";
#ifdef CASCADE_HAVE_CUDA
  if (f.backend == "cuda") {
    auto name = cuda::DeviceName(0);
    device = name.ok() ? *name : name.status().ToString();
  }
#endif
  std::printf(
      "# tier_bench: backend %s (%s), preset %s; %d tenants x %d-token system chunk, query %d, "
      "gen %d, %d rounds, concurrency %d, GPU tier %.2f of the working set\n\n",
      f.backend.c_str(), device.c_str(), f.preset.c_str(), f.tenants, f.system_len, f.query_len,
      f.gen, f.rounds, f.concurrency, f.gpu_fraction);
  std::printf(
      "| host tier | GPU blocks | host blocks | hit rate | of it from host | TTFT p50 ms | TTFT "
      "p99 "
      "ms | cold TTFT p50 ms | req/s | out tok/s | s | offloaded (ahead) | skipped | steps "
      "waiting |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::map<std::string, double> p50;
  for (const std::string& h : f.host) {
    const RunResult r = Run(f, **m, h);
    const engine::EngineStats& s = r.stats;
    const double hit = s.prefix_cache_queries > 0 ? static_cast<double>(s.prefix_cache_hits) /
                                                        static_cast<double>(s.prefix_cache_queries)
                                                  : 0;
    const double from_host = s.prefix_cache_hits > 0
                                 ? static_cast<double>(s.prefix_cache_hits_host) /
                                       static_cast<double>(s.prefix_cache_hits)
                                 : 0;
    p50[h] = Percentile(r.ttft_ms, 0.5);
    std::printf(
        "| %s | %lld | %lld | %.1f%% | %.1f%% | %.1f | %.1f | %.1f | %.2f | %.0f | %.1f | %lld "
        "(%lld) | %lld | %lld |\n",
        h.c_str(), static_cast<long long>(s.total_blocks),
        static_cast<long long>(s.host_total_blocks), 100 * hit, 100 * from_host, p50[h],
        Percentile(r.ttft_ms, 0.99), Percentile(r.ttft_cold_ms, 0.5),
        f.tenants * f.rounds / r.seconds, static_cast<double>(r.output_tokens) / r.seconds,
        r.seconds, static_cast<long long>(s.host_offloaded_blocks),
        static_cast<long long>(s.host_offloaded_ahead_blocks),
        static_cast<long long>(s.host_offload_skipped_blocks),
        static_cast<long long>(s.host_offload_waits));
    std::fflush(stdout);
  }
  if (p50.count("on") && p50.count("off") && p50["on"] > 0) {
    std::printf("\nTTFT p50 (rounds after the first), host tier off / on: %.2fx\n",
                p50["off"] / p50["on"]);
  }
  return 0;
}

}  // namespace
}  // namespace cascade::bench

int main(int argc, char** argv) { return cascade::bench::Main(argc, argv); }
