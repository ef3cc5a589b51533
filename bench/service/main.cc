// cascade-loadgen: a service load generator. Talks real gRPC to a gateway on this machine
// (--gateway=127.0.0.1:PORT) or starts its own local stack (--local: registry, N CPU workers and a
// gateway as child processes), runs bounded cache-miss and cache-hit phases at each concurrency,
// and prints a Markdown table of throughput, TTFT and inter-token latency, hit and miss side by
// side. With --qps it runs the cluster benchmark instead (open_loop.h): the customers workload
// at each Poisson arrival rate, with --local once per --route_policies entry (a fresh stack
// each), reported per policy and rate with the cost router against the others.
// Progress goes to stderr, the report to stdout.
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
#include "bench/service/open_loop.h"
#include "bench/service/report.h"
#include "bench/service/workload.h"
#include "common/flags.h"
#include "services/cli/gateway_client.h"
#include "services/cli/local_stack.h"

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
  std::string worker_flags;   // --local: extra worker flags, space-separated
  std::string gateway_flags;  // --local: extra gateway flags, space-separated
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
  std::string qps;  // non-empty: the cluster benchmark
  int customers = 16;
  int context_words = 1200;
  std::string route_policies = "cost,load,round_robin,random";
  int max_inflight = 512;
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
  f->AddString("worker_flags", &o->worker_flags,
               "--local: extra flags for every worker, space-separated (e.g. "
               "\"--host_kv_bytes=0 --max_batch=128\")");
  f->AddString("gateway_flags", &o->gateway_flags,
               "--local: extra flags for the gateway, space-separated (e.g. "
               "\"--route_recent_ms=0\")");
  f->AddString("log_dir", &o->log_dir,
               "--local: servers' logs (with --qps, a sub-folder per route policy); default: a "
               "temporary directory, removed after a clean run");
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
  f->AddString("qps", &o->qps,
               "cluster benchmark: comma-separated Poisson arrival rates (requests/s) of the "
               "customers workload; replaces --concurrency and --workloads");
  f->AddInt("customers", &o->customers, "--qps: customers, each with its own system + context");
  f->AddInt("context_words", &o->context_words, "--qps: words of each customer's context chunk");
  f->AddString("route_policies", &o->route_policies,
               "--qps --local: gateway --route_policy values to compare, a fresh stack each; the "
               "first is the one the others are compared against");
  f->AddInt("max_inflight", &o->max_inflight,
            "--qps: open requests at most; an arrival beyond counts as CLIENT_BACKLOG");
}

absl::StatusOr<std::vector<double>> ParseRates(const std::string& text) {
  std::vector<double> rates;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    double v = 0;
    if (!absl::SimpleAtod(part, &v) || !(v > 0) || v > 10000) {
      return absl::InvalidArgumentError(
          absl::StrCat("--qps: '", std::string(part), "' is not a rate in (0, 10000]"));
    }
    rates.push_back(v);
  }
  if (rates.empty()) return absl::InvalidArgumentError("--qps: no rate given");
  return rates;
}

absl::StatusOr<std::vector<std::string>> ParsePolicies(const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    if (part != "cost" && part != "load" && part != "round_robin" && part != "random") {
      return absl::InvalidArgumentError(absl::StrCat("--route_policies: '", std::string(part),
                                                     "' is not cost, load, round_robin or random"));
    }
    out.emplace_back(part);
  }
  if (out.empty()) return absl::InvalidArgumentError("--route_policies: none given");
  return out;
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
// Fails only when the address does not serve cascade.v2.GatewayService at all.
absl::Status WaitForWorkers(v2::GatewayService::Stub& stub, int want, const std::string& token) {
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
            absl::StrCat("the address does not serve cascade.v2.GatewayService (",
                         models.status().message(), "); is it the gateway's port?"));
      }
      last = std::string(models.status().message());
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::cerr << " going on anyway (" << last << ")" << std::endl;
  return absl::OkStatus();
}

absl::Status Prewarm(v2::GatewayService::Stub& stub, const PromptSource& prompts,
                     const LoadgenFlags& flags) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + flags.request_timeout));
  if (!flags.auth_token.empty()) ctx.AddMetadata("authorization", "Bearer " + flags.auth_token);
  v2::RegisterChunkResponse response;
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

// Starts the --local stack (registry, workers, gateway with `gateway_flags` added); its logs go
// to --log_dir/`log_subdir` when --log_dir is set.
absl::StatusOr<std::unique_ptr<cli::LocalStack>> StartLocalStack(
    const LoadgenFlags& flags, std::vector<std::string> gateway_flags,
    const std::string& log_subdir) {
  absl::StatusOr<std::string> self = cli::SelfBinaryDir();
  if (!self.ok()) return self.status();
  absl::StatusOr<std::string> model_dir =
      flags.model_dir.empty()
          ? cli::PrepareModel(
                (std::filesystem::path(*self).parent_path() / "models" / flags.preset).string(),
                flags.preset, &std::cerr)
          : cli::PrepareModel(flags.model_dir, flags.preset, &std::cerr);
  if (!model_dir.ok()) return model_dir.status();
  cli::StackOptions so;
  so.bin_dir = flags.bin_dir.empty() ? (std::filesystem::path(*self).parent_path() / "bin").string()
                                     : flags.bin_dir;
  so.model_dir = *model_dir;
  so.workers = flags.workers;
  so.backend = flags.backend;
  so.worker_threads = flags.worker_threads;
  so.kv_cache_bytes = flags.kv_cache_bytes;
  for (absl::string_view f : absl::StrSplit(flags.worker_flags, ' ', absl::SkipWhitespace())) {
    so.worker_flags.emplace_back(f);
  }
  so.log_dir = flags.log_dir.empty() || log_subdir.empty()
                   ? flags.log_dir
                   : (std::filesystem::path(flags.log_dir) / log_subdir).string();
  for (absl::string_view f : absl::StrSplit(flags.gateway_flags, ' ', absl::SkipWhitespace())) {
    gateway_flags.emplace_back(f);
  }
  so.gateway_flags = std::move(gateway_flags);
  absl::StatusOr<std::unique_ptr<cli::LocalStack>> started = cli::LocalStack::Start(so, &std::cerr);
  if (!started.ok()) {
    return absl::Status(started.status().code(),
                        absl::StrCat("starting the local stack: ", started.status().message()));
  }
  return started;
}

// Stops a --local stack; keeps its logs when something failed (a temporary directory goes).
void StopLocalStack(cli::LocalStack& stack, bool failed) {
  stack.Stop(&std::cerr);
  if (failed || !stack.RemoveOwnLogDir()) std::cerr << "servers' logs: " << stack.log_dir() << "\n";
}

// What a phase loads: the --local stack (started with `gateway_flags` added) or --gateway, and a
// stub on its gateway once the gateway lists the workers.
struct Target {
  std::unique_ptr<cli::LocalStack> stack;  // null with --gateway
  std::unique_ptr<v2::GatewayService::Stub> stub;
  std::string address;
};

// Errors: InvalidArgument for a bad address (exit 2), others for a stack or gateway that does
// not come up (exit 1).
absl::StatusOr<Target> Connect(const LoadgenFlags& flags, std::vector<std::string> gateway_flags,
                               const std::string& log_subdir = "") {
  Target t;
  t.address = flags.gateway;
  if (flags.local) {
    absl::StatusOr<std::unique_ptr<cli::LocalStack>> started =
        StartLocalStack(flags, std::move(gateway_flags), log_subdir);
    if (!started.ok()) return absl::UnavailableError(started.status().message());
    t.stack = std::move(*started);
    t.address = t.stack->gateway().address;
  }
  if (absl::Status s = CheckLoopback(t.address); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = cli::Dial(t.address);
  if (!channel.ok()) return absl::InvalidArgumentError(channel.status().message());
  t.stub = v2::GatewayService::NewStub(*channel);
  if (absl::Status s = WaitForWorkers(*t.stub, flags.local ? flags.workers : 1, flags.auth_token);
      !s.ok()) {
    return absl::UnavailableError(s.message());
  }
  return t;
}

// Exit code for a Connect error, after saying it.
int ConnectFailed(const absl::Status& s) {
  std::cerr << "cascade-loadgen: " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? common::kExitBadFlags : 1;
}

// The cluster benchmark: per policy (a fresh --local stack each, or the deployed gateway), the
// customers workload at each rate.
int RunCluster(const LoadgenFlags& flags) {
  auto fail = [](const absl::Status& s) {
    std::cerr << "cascade-loadgen: " << s.message() << "\n";
    return common::kExitBadFlags;
  };
  absl::StatusOr<std::vector<double>> rates = ParseRates(flags.qps);
  if (!rates.ok()) return fail(rates.status());
  std::vector<std::string> policies = {"deployed"};
  if (flags.local) {
    absl::StatusOr<std::vector<std::string>> p = ParsePolicies(flags.route_policies);
    if (!p.ok()) return fail(p.status());
    policies = *p;
  }
  if (flags.customers < 1 || flags.context_words < 0 || flags.max_inflight < 1) {
    return fail(absl::InvalidArgumentError(
        "--customers and --max_inflight must be positive, --context_words not negative"));
  }
  WorkloadOptions wo;
  wo.system_words = flags.system_words;
  wo.query_words = flags.query_words;
  wo.max_tokens = flags.max_tokens;
  wo.seed = static_cast<uint64_t>(flags.seed);
  wo.customers = flags.customers;
  wo.context_words = flags.context_words;
  std::vector<OpenLoopSummary> runs;
  int64_t failed = 0, ok = 0;
  for (const std::string& policy : policies) {
    if (flags.local) std::cerr << "policy " << policy << ": starting a fresh stack\n";
    absl::StatusOr<Target> target = Connect(flags, {"--route_policy=" + policy}, policy);
    if (!target.ok()) return ConnectFailed(target.status());
    v2::GatewayService::Stub* stub = target->stub.get();
    // The same texts for every policy (the run tag is fixed), so each stack sees one workload.
    wo.run_tag = absl::StrCat("cluster", flags.seed);
    PromptSource prompts(wo);
    for (double qps : *rates) {
      OpenLoopOptions oo;
      oo.qps = qps;
      oo.duration = flags.duration;
      oo.max_requests = flags.max_requests;
      oo.max_inflight = flags.max_inflight;
      oo.request_timeout = flags.request_timeout;
      oo.progress_interval = flags.progress_interval;
      oo.bearer_token = flags.auth_token;
      oo.policy = policy;
      oo.seed = static_cast<uint64_t>(flags.seed);
      std::cerr << absl::StrFormat("policy %s, %.2f qps (bounds: %s, %d requests)\n", policy, qps,
                                   absl::FormatDuration(flags.duration), flags.max_requests);
      runs.push_back(RunOpenLoop(*stub, prompts, oo, flags.local ? flags.workers : 1, &std::cerr));
      // One line per (policy, rate) as it ends, so a run stopped part-way keeps what it measured.
      const PhaseSummary& p = runs.back().phase;
      std::cerr << absl::StrFormat(
          "  [%s %.2f qps] %d/%d ok, TTFT p50 / p90 / p99 %.1f / %.1f / %.1f ms, %.1f output "
          "tok/s, hit rate %.3f, imbalance %.2f\n",
          policy, qps, p.ok, p.requests, p.ttft_ms.p50, p.ttft_ms.p90, p.ttft_ms.p99,
          p.output_tokens_per_s, runs.back().hit_rate, runs.back().imbalance);
      ok += runs.back().phase.ok;
      failed += runs.back().phase.requests - runs.back().phase.ok;
    }
    if (target->stack) StopLocalStack(*target->stack, failed > 0);
  }
  std::cout << "machine: " << DescribeMachine() << "\n"
            << "target: "
            << (flags.local ? absl::StrCat("local stack, ", flags.workers, " ", flags.backend,
                                           " worker(s), a fresh one per policy")
                            : absl::StrCat("gateway ", flags.gateway))
            << "; customers workload: " << flags.customers << " customers, system "
            << flags.system_words << " + context " << flags.context_words << " words each, query "
            << flags.query_words << " words, max_tokens " << flags.max_tokens << "\n";
  PrintClusterReport(runs, std::cout);
  if (ok == 0) {
    std::cerr << "cascade-loadgen: no request succeeded\n";
    return 1;
  }
  return 0;
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
  if (!flags.qps.empty()) return RunCluster(flags);
  absl::StatusOr<std::vector<int>> levels = ParseLevels(flags.concurrency);
  if (!levels.ok()) return fail(levels.status());
  absl::StatusOr<std::vector<Workload>> workloads = ParseWorkloads(flags.workloads);
  if (!workloads.ok()) return fail(workloads.status());

  absl::StatusOr<Target> target = Connect(flags, {});
  if (!target.ok()) return ConnectFailed(target.status());
  v2::GatewayService::Stub* stub = target->stub.get();
  const std::string& address = target->address;
  std::unique_ptr<cli::LocalStack>& stack = target->stack;

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
  if (stack) StopLocalStack(*stack, failed > 0);
  if (ok == 0) {
    std::cerr << "cascade-loadgen: no request succeeded\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace cascade::bench

int main(int argc, char** argv) { return cascade::bench::Run(argc, argv); }
