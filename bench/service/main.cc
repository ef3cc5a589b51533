// cascade-loadgen: a service load generator. Talks real gRPC to a gateway on this machine
// (--gateway=127.0.0.1:PORT) or starts its own local stack (--local: registry, N CPU workers and a
// gateway as child processes), runs bounded cache-miss and cache-hit phases at each concurrency,
// and prints a Markdown table of throughput, TTFT and inter-token latency, hit and miss side by
// side. Progress goes to stderr, the report to stdout.
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/service/load_runner.h"
#include "bench/service/report.h"
#include "bench/service/workload.h"
#include "services/cli/gateway_client.h"
#include "services/cli/local_stack.h"
#include "common/flags.h"

namespace cascade::bench {
namespace {

struct LoadgenFlags {
  std::string gateway;
  bool local = false;
  int workers = 1;
  std::string backend = "cpu";  // --local workers' backend
  std::string bin_dir;
  std::string model_dir;
  std::string preset = "tiny";
  int worker_threads = 0;
  int64_t kv_cache_bytes = 0;
  std::string log_dir;
  std::string concurrency = "1,4";
  std::string workloads = "miss,hit";
  absl::Duration duration = absl::Seconds(10);
  int64_t max_requests = 200;
  bool prewarm = true;
  int64_t pin_ttl_seconds = 600;
  int warmup_requests = 2;
  int max_tokens = 16;
  int system_words = 600;
  int query_words = 12;
  int64_t seed = 1;
  absl::Duration request_timeout = absl::Seconds(60);
  absl::Duration progress_interval = absl::Seconds(2);
  std::string auth_token;
};

void RegisterFlags(common::FlagSet* f, LoadgenFlags* o) {
  f->AddString("gateway", &o->gateway, "gateway HOST:PORT on this machine (loopback only)");
  f->AddBool("local", &o->local, "start a local registry + workers + gateway and load it");
  f->AddInt("workers", &o->workers, "--local: workers");
  f->AddString("backend", &o->backend, "--local: worker backend: cpu | cuda | auto");
  f->AddString("bin_dir", &o->bin_dir,
               "--local: where cascade-registry/-worker/-gateway are; default: ../bin");
  f->AddString("model_dir", &o->model_dir,
               "--local: model directory; default: ../models/<preset>, generated if absent");
  f->AddString("preset", &o->preset, "--local: model preset generated when there is no model");
  f->AddInt("worker_threads", &o->worker_threads, "--local: CPU threads per worker; 0: cores/N");
  f->AddInt64("kv_cache_bytes", &o->kv_cache_bytes, "--local: KV bytes per worker; 0: default");
  f->AddString("log_dir", &o->log_dir,
               "--local: servers' logs; default: a temporary directory, removed after a clean run");
  f->AddString("concurrency", &o->concurrency, "comma-separated client concurrency levels");
  f->AddString("workloads", &o->workloads, "comma-separated phases per level: miss, hit");
  f->AddDuration("duration", &o->duration, "time bound per phase (no new request after it)");
  f->AddInt64("max_requests", &o->max_requests, "request bound per phase");
  f->AddBool("prewarm", &o->prewarm, "RegisterChunk the hit workload's system chunk first");
  f->AddInt64("pin_ttl_seconds", &o->pin_ttl_seconds, "registry pin of the pre-warmed chunk");
  f->AddInt("warmup_requests", &o->warmup_requests, "unrecorded requests before the phases");
  f->AddInt("max_tokens", &o->max_tokens, "tokens generated per request (ignore_eos)");
  f->AddInt("system_words", &o->system_words, "words in the system chunk (~1.5 tokens each)");
  f->AddInt("query_words", &o->query_words, "words in the query chunk");
  f->AddInt64("seed", &o->seed, "seed of the prompt texts");
  f->AddDuration("request_timeout", &o->request_timeout, "deadline of each request");
  f->AddDuration("progress_interval", &o->progress_interval, "time between progress lines");
  f->AddString("auth_token", &o->auth_token, "bearer token, if the gateway requires one");
}

absl::StatusOr<std::vector<int>> ParseLevels(const std::string& text) {
  std::vector<int> levels;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1 || v > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("--concurrency: '", std::string(part), "' is not a level in 1..1024"));
    }
    levels.push_back(v);
  }
  if (levels.empty()) return absl::InvalidArgumentError("--concurrency: no level given");
  return levels;
}

absl::StatusOr<std::vector<Workload>> ParseWorkloads(const std::string& text) {
  std::vector<Workload> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    if (part == "miss") {
      out.push_back(Workload::kMiss);
    } else if (part == "hit") {
      out.push_back(Workload::kHit);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--workloads: '", std::string(part), "' is not miss or hit"));
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("--workloads: none given");
  return out;
}

// The gateway learns workers from the registry; wait (bounded) until it lists `want` of them.
// Fails only when the address does not serve cascade.v1.Gateway at all.
absl::Status WaitForWorkers(v1::Gateway::Stub& stub, int want, const std::string& token) {
  std::cerr << "waiting for the gateway to list " << want << " worker(s) ..." << std::flush;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::string last = "no answer";
  while (absl::Now() < deadline) {
    auto models = cli::ListModels(stub, {absl::Seconds(2), token});
    if (models.ok() && models->models_size() > 0) {
      last = absl::StrCat(models->models(0).workers(), " worker(s)");
      if (models->models(0).workers() >= want) {
        std::cerr << " model " << models->models(0).name() << " on " << last << std::endl;
        return absl::OkStatus();
      }
    } else if (!models.ok()) {
      if (models.status().code() == absl::StatusCode::kUnimplemented) {
        std::cerr << std::endl;
        return absl::FailedPreconditionError(
            absl::StrCat("the address does not serve cascade.v1.Gateway (",
                         models.status().message(), "); is it the gateway's port?"));
      }
      last = std::string(models.status().message());
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::cerr << " going on anyway (" << last << ")" << std::endl;
  return absl::OkStatus();
}

absl::Status Prewarm(v1::Gateway::Stub& stub, const PromptSource& prompts,
                     const LoadgenFlags& flags) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + flags.request_timeout));
  if (!flags.auth_token.empty()) ctx.AddMetadata("authorization", "Bearer " + flags.auth_token);
  v1::RegisterChunkResponse response;
  const absl::Time start = absl::Now();
  absl::Status s =
      cli::FromGrpc(stub.RegisterChunk(&ctx, prompts.WarmRequest(flags.pin_ttl_seconds), &response),
                    "RegisterChunk");
  if (!s.ok()) return s;
  const int64_t tokens =
      response.chunks_size() > 0 ? response.chunks(response.chunks_size() - 1).end() : 0;
  std::cerr << absl::StrFormat(
      "pre-warm: RegisterChunk cached the %d-token system chunk on %s "
      "in %.0f ms\n",
      tokens, response.worker_id(), absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

int Run(int argc, char** argv) {
  LoadgenFlags flags;
  common::FlagSet flag_set(
      "cascade-loadgen",
      "Service load generator: bounded cache-miss and cache-hit phases over real gRPC, reported "
      "as throughput, TTFT and inter-token latency percentiles. Give --gateway=HOST:PORT "
      "(loopback) or --local.");
  RegisterFlags(&flag_set, &flags);
  if (std::optional<int> code = common::ParseFlags(flag_set, argc, argv)) return *code;
  auto fail = [](const absl::Status& s) {
    std::cerr << "cascade-loadgen: " << s.message() << "\n";
    return common::kExitBadFlags;
  };
  if (flags.local == !flags.gateway.empty()) {
    return fail(absl::InvalidArgumentError("give exactly one of --local and --gateway"));
  }
  if (flags.duration <= absl::ZeroDuration() || flags.max_requests < 1 || flags.max_tokens < 1 ||
      flags.system_words < 1 || flags.query_words < 1 || flags.workers < 1) {
    return fail(absl::InvalidArgumentError(
        "--duration, --max_requests, --max_tokens, --system_words, --query_words and --workers "
        "must be positive"));
  }
  absl::StatusOr<std::vector<int>> levels = ParseLevels(flags.concurrency);
  if (!levels.ok()) return fail(levels.status());
  absl::StatusOr<std::vector<Workload>> workloads = ParseWorkloads(flags.workloads);
  if (!workloads.ok()) return fail(workloads.status());

  std::unique_ptr<cli::LocalStack> stack;
  std::string address = flags.gateway;
  if (flags.local) {
    absl::StatusOr<std::string> self = cli::SelfBinaryDir();
    if (!self.ok()) return fail(self.status());
    absl::StatusOr<std::string> model_dir =
        flags.model_dir.empty()
            ? cli::PrepareModel(
                  (std::filesystem::path(*self).parent_path() / "models" / flags.preset).string(),
                  flags.preset, &std::cerr)
            : cli::PrepareModel(flags.model_dir, flags.preset, &std::cerr);
    if (!model_dir.ok()) return fail(model_dir.status());
    cli::StackOptions so;
    so.bin_dir = flags.bin_dir.empty()
                     ? (std::filesystem::path(*self).parent_path() / "bin").string()
                     : flags.bin_dir;
    so.model_dir = *model_dir;
    so.workers = flags.workers;
    so.backend = flags.backend;
    so.worker_threads = flags.worker_threads;
    so.kv_cache_bytes = flags.kv_cache_bytes;
    so.log_dir = flags.log_dir;
    absl::StatusOr<std::unique_ptr<cli::LocalStack>> started =
        cli::LocalStack::Start(so, &std::cerr);
    if (!started.ok()) {
      std::cerr << "cascade-loadgen: starting the local stack: " << started.status().message()
                << "\n";
      return 1;
    }
    stack = std::move(*started);
    address = stack->gateway().address;
  }
  if (absl::Status s = CheckLoopback(address); !s.ok()) return fail(s);

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = cli::Dial(address);
  if (!channel.ok()) return fail(channel.status());
  std::unique_ptr<v1::Gateway::Stub> stub = v1::Gateway::NewStub(*channel);
  if (absl::Status s = WaitForWorkers(*stub, flags.local ? flags.workers : 1, flags.auth_token);
      !s.ok()) {
    std::cerr << "cascade-loadgen: " << s.message() << "\n";
    return 1;
  }

  WorkloadOptions wo;
  wo.system_words = flags.system_words;
  wo.query_words = flags.query_words;
  wo.max_tokens = flags.max_tokens;
  wo.seed = static_cast<uint64_t>(flags.seed);
  wo.run_tag = absl::StrFormat("%x", absl::ToUnixMicros(absl::Now()) & 0xffffffffff);
  PromptSource prompts(wo);

  const cli::CallOptions call{flags.request_timeout, flags.auth_token};
  for (int i = 0; i < flags.warmup_requests; ++i) {
    auto r = cli::RunGenerate(*stub, prompts.Make(Workload::kMiss, prompts.NextIndex()), call);
    if (!r.ok()) {
      // The warm-up is also the check that the path works: loading a broken one measures nothing.
      std::cerr << "cascade-loadgen: warm-up request failed: " << r.status().message() << "\n";
      return 1;
    }
    std::cerr << "warm-up request " << i + 1 << ": " << cli::FormatSummary(*r) << "\n";
  }
  bool wants_hit = false;
  for (Workload w : *workloads) wants_hit |= w == Workload::kHit;
  if (flags.prewarm && wants_hit) {
    if (absl::Status s = Prewarm(*stub, prompts, flags); !s.ok()) {
      std::cerr << "pre-warm failed (the hit phase's first request will miss): " << s.message()
                << "\n";
    }
  }

  std::vector<PhaseSummary> phases;
  for (int level : *levels) {
    for (Workload w : *workloads) {
      PhaseOptions po;
      po.workload = w;
      po.concurrency = level;
      po.duration = flags.duration;
      po.max_requests = flags.max_requests;
      po.request_timeout = flags.request_timeout;
      po.progress_interval = flags.progress_interval;
      po.bearer_token = flags.auth_token;
      std::cerr << absl::StrFormat("phase %s, concurrency %d (bounds: %s, %d requests)\n",
                                   WorkloadName(w), level, absl::FormatDuration(flags.duration),
                                   flags.max_requests);
      phases.push_back(RunPhase(*stub, prompts, po, &std::cerr));
    }
  }

  std::cout << "machine: " << DescribeMachine() << "\n"
            << "target: "
            << (flags.local ? absl::StrCat("local stack, ", flags.workers, " ", flags.backend,
                                           " worker(s), ")
                            : "")
            << "gateway " << address << "; max_tokens " << flags.max_tokens << ", system "
            << flags.system_words << " words, query " << flags.query_words << " words, prewarm "
            << (flags.prewarm ? "on" : "off") << "\n";
  PrintReport(phases, std::cout);
  int64_t ok = 0, failed = 0;
  for (const PhaseSummary& p : phases) {
    ok += p.ok;
    failed += p.requests - p.ok;
  }
  if (stack) {
    stack->Stop(&std::cerr);
    // Keep the servers' logs when something failed; a temporary directory goes otherwise.
    if (flags.log_dir.empty() && failed == 0) {
      std::error_code ec;
      std::filesystem::remove_all(stack->log_dir(), ec);
    } else {
      std::cerr << "servers' logs: " << stack->log_dir() << "\n";
    }
  }
  if (ok == 0) {
    std::cerr << "cascade-loadgen: no request succeeded\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace cascade::bench

int main(int argc, char** argv) { return cascade::bench::Run(argc, argv); }
