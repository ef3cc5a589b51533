// cascade-soak: runs the CPU stack under `cascade up` for a while at 10x the gateway's admitted
// concurrency, with random client cancels, a worker SIGKILL and a registry SIGKILL every minute
// (`cascade up` restarts them), and checks every stream against a cold reference computed on the
// idle stack first. Reports admitted latency (TTFT, end-to-end) against an unloaded phase,
// rejections by code, lost and wrong streams, and each process's memory at start and end.
// Exits 1 on any lost or wrong stream. Only loopback; every phase bounded in time and count.
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/service/load_runner.h"
#include "bench/service/report.h"
#include "bench/service/workload.h"
#include "bench/soak/chaos.h"
#include "bench/soak/soak_check.h"
#include "common/flags.h"
#include "services/cli/child_process.h"
#include "services/cli/command_util.h"
#include "services/cli/gateway_client.h"
#include "services/cli/local_stack.h"
#include "services/cli/proc_info.h"

namespace cascade::bench {
namespace {
namespace fs = std::filesystem;

// How long after a kill the stack is still recovering (a worker restarts in ~2 s; the
// gateway keeps a failed worker down for 2 s).
constexpr double kKillSettleSeconds = 3;

struct SoakFlags {
  absl::Duration duration = absl::Minutes(3);
  int admitted = 32;  // the gateway's --max_concurrent
  int overload = 10;  // clients = overload x admitted
  int workers = 2;
  int worker_threads = 1;
  absl::Duration worker_kill_interval = absl::Minutes(1);
  absl::Duration registry_kill_interval = absl::Minutes(1);
  absl::Duration registry_kill_offset = absl::Seconds(30);
  double cancel_fraction = 0.1;
  absl::Duration reject_backoff = absl::Milliseconds(500);
  int pool = 24;
  int max_tokens = 32;
  int system_words = 120;
  int query_words = 10;
  int unloaded_concurrency = 1;
  absl::Duration unloaded_duration = absl::Seconds(30);
  int64_t max_requests = 200000;
  absl::Duration request_timeout = absl::Seconds(120);
  int64_t seed = 1;
  std::string bin_dir;
  std::string model_dir;
  std::string log_dir;
  std::vector<std::string> up_flags;
};

void RegisterFlags(common::FlagSet* f, SoakFlags* o) {
  f->AddDuration("duration", &o->duration, "length of the loaded phase (with the kills)");
  f->AddInt("admitted", &o->admitted, "the gateway's --max_concurrent (admitted streams)");
  f->AddInt("overload", &o->overload, "clients in the loaded phase = overload x admitted");
  f->AddInt("workers", &o->workers, "CPU workers under cascade up");
  f->AddInt("worker_threads", &o->worker_threads, "CPU backend threads per worker");
  f->AddDuration("worker_kill_interval", &o->worker_kill_interval,
                 "SIGKILL a worker (in turn) this often; 0: never");
  f->AddDuration("registry_kill_interval", &o->registry_kill_interval,
                 "SIGKILL the registry this often; 0: never");
  f->AddDuration("registry_kill_offset", &o->registry_kill_offset,
                 "first registry kill this far into the loaded phase");
  f->AddDouble("cancel_fraction", &o->cancel_fraction,
               "fraction of loaded-phase requests the client cancels mid-stream");
  f->AddDuration("reject_backoff", &o->reject_backoff,
                 "a refused client waits 0.5x..1.5x this before its next request");
  f->AddInt("pool", &o->pool, "distinct requests (each with a cold reference)");
  f->AddInt("max_tokens", &o->max_tokens, "tokens per request (ignore_eos)");
  f->AddInt("system_words", &o->system_words, "words in each system chunk");
  f->AddInt("query_words", &o->query_words, "words in each query");
  f->AddInt("unloaded_concurrency", &o->unloaded_concurrency, "clients in the unloaded phase");
  f->AddDuration("unloaded_duration", &o->unloaded_duration, "length of the unloaded phase");
  f->AddInt64("max_requests", &o->max_requests, "requests per phase at most");
  f->AddDuration("request_timeout", &o->request_timeout, "deadline of every request");
  f->AddInt64("seed", &o->seed, "seed of prompts, draws, cancels");
  f->AddString("bin_dir", &o->bin_dir, "where cascade and the servers are; default: ../bin");
  f->AddString("model_dir", &o->model_dir, "model; default: ../models/tiny (generated if absent)");
  f->AddString("log_dir", &o->log_dir,
               "logs of cascade up and its children; default: a new "
               "/tmp/cascade-soak-*");
  cli::AddRepeatedString(f, "up_flag", &o->up_flags,
                         "extra flag for `cascade up`, e.g. --up_flag=--gateway_flag=--x=1");
}

std::string Validate(const SoakFlags& o) {
  if (o.duration <= absl::ZeroDuration() || o.duration > absl::Hours(24)) {
    return "--duration must be in (0, 24h]";
  }
  if (o.admitted < 1 || o.overload < 1 || o.admitted * o.overload > 2048) {
    return "--admitted and --overload must be >= 1, with admitted x overload <= 2048 clients";
  }
  if (o.workers < 1 || o.workers > 8) return "--workers must be in [1, 8]";
  if (o.worker_threads < 1) return "--worker_threads must be >= 1";
  if (o.cancel_fraction < 0 || o.cancel_fraction > 1) return "--cancel_fraction must be in [0, 1]";
  if (o.pool < 1 || o.pool > 1000) return "--pool must be in [1, 1000]";
  if (o.max_tokens < 2 || o.max_tokens > 1024) return "--max_tokens must be in [2, 1024]";
  if (o.system_words < 1 || o.query_words < 1) return "--system_words, --query_words >= 1";
  if (o.unloaded_concurrency < 1 || o.unloaded_concurrency > 64) {
    return "--unloaded_concurrency must be in [1, 64]";
  }
  if (o.unloaded_duration <= absl::ZeroDuration()) return "--unloaded_duration must be positive";
  if (o.max_requests < 1) return "--max_requests must be positive";
  if (o.worker_kill_interval < absl::ZeroDuration() ||
      o.registry_kill_interval < absl::ZeroDuration() ||
      o.registry_kill_offset < absl::ZeroDuration()) {
    return "kill intervals and offset must not be negative";
  }
  return "";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int64_t CountLines(const std::string& text, const std::string& needle) {
  int64_t n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) n += absl::StrContains(line, needle);
  return n;
}

// The pool: half share one system chunk (cache hits), half have their own (misses); every third
// is seeded temperature sampling rather than greedy.
std::vector<v2::GenerateRequest> MakePool(const SoakFlags& f) {
  WorkloadOptions wo;
  wo.system_words = f.system_words;
  wo.query_words = f.query_words;
  wo.max_tokens = f.max_tokens;
  wo.seed = static_cast<uint64_t>(f.seed);
  wo.run_tag = absl::StrFormat("soak%d", f.seed);
  PromptSource prompts(wo);
  std::vector<v2::GenerateRequest> pool;
  for (int i = 0; i < f.pool; ++i) {
    v2::GenerateRequest r = prompts.Make(i % 2 == 0 ? Workload::kHit : Workload::kMiss, i);
    if (i % 3 == 2) {
      r.mutable_sampling()->set_temperature(0.8f);
      r.mutable_sampling()->set_seed(7000 + static_cast<uint64_t>(i));
    }
    pool.push_back(std::move(r));
  }
  return pool;
}

constexpr absl::Duration kMemorySampleInterval = absl::Seconds(30);

struct ProcessMemory {
  std::string role;
  pid_t pid = -1;
  int64_t rss = -1;
};

// `cascade up` itself, then its children by role, then this process.
std::vector<ProcessMemory> SnapshotMemory(pid_t up_pid, int workers) {
  std::vector<ProcessMemory> out;
  out.push_back({"cascade up", up_pid, cli::ResidentBytes(up_pid)});
  std::vector<std::string> roles = {"registry"};
  for (int i = 0; i < workers; ++i) roles.push_back(absl::StrCat("worker-", i));
  for (const std::string& role : roles) {
    const pid_t pid = FindStackChild(up_pid, role);
    out.push_back({role, pid, pid > 0 ? cli::ResidentBytes(pid) : -1});
  }
  pid_t gateway = -1;
  for (const cli::ProcessInfo& p : cli::ChildProcesses(up_pid)) {
    if (!p.args.empty() && absl::EndsWith(p.args[0], "/cascade-gateway")) gateway = p.pid;
  }
  out.push_back({"gateway", gateway, gateway > 0 ? cli::ResidentBytes(gateway) : -1});
  out.push_back({"cascade-soak (clients)", getpid(), cli::ResidentBytes(getpid())});
  return out;
}

std::string Mib(int64_t bytes) {
  return bytes < 0 ? "-" : absl::StrFormat("%.1f", bytes / 1048576.0);
}
std::string Ms1(double v, int64_t count) { return count > 0 ? absl::StrFormat("%.1f", v) : "-"; }
std::string Ratio(double a, double b) { return b > 0 ? absl::StrFormat("%.2fx", a / b) : "-"; }

PhaseOptions PoolPhase(const SoakFlags& f, const std::vector<v2::GenerateRequest>& pool,
                       int concurrency, absl::Duration duration, double cancel, uint64_t seed) {
  PhaseOptions po;
  po.workload = Workload::kHit;  // only labels the progress lines; requests come from the pool
  po.concurrency = concurrency;
  po.duration = duration;
  po.max_requests = f.max_requests;
  po.request_timeout = f.request_timeout;
  po.progress_interval = absl::Seconds(10);
  po.pool = &pool;
  po.cancel_fraction = cancel;
  po.reject_backoff = f.reject_backoff;
  po.seed = seed;
  return po;
}

void PrintTallyRow(const std::string& name, int clients, double wall_s, const SoakTally& t,
                   std::ostream& out) {
  out << absl::StrFormat(
      "| %s | %d | %.0f | %d | %d | %d | %d | %d | %d | %s | %s | %s | %s | %s |\n", name, clients,
      wall_s, t.requests, t.admitted, t.completed, t.cancelled, t.lost, t.wrong,
      Ms1(t.ttft_ms.p50, t.ttft_ms.count), Ms1(t.ttft_ms.p99, t.ttft_ms.count),
      Ms1(t.e2e_ms.p50, t.e2e_ms.count), Ms1(t.e2e_ms.p99, t.e2e_ms.count),
      FormatErrors(t.rejected));
}

int Run(int argc, char** argv) {
  SoakFlags flags;
  common::FlagSet flag_set(
      "cascade-soak",
      "Soak of the CPU stack under `cascade up`: an unloaded phase, then --duration at "
      "--overload x --admitted clients with cancels and a worker and a registry SIGKILL every "
      "minute; every stream is checked against its cold reference. Exits 1 on any lost or wrong "
      "stream.");
  RegisterFlags(&flag_set, &flags);
  if (std::optional<int> code = common::ParseFlags(flag_set, argc, argv)) return *code;
  if (std::string bad = Validate(flags); !bad.empty()) {
    std::cerr << "cascade-soak: " << bad << "\n";
    return common::kExitBadFlags;
  }
  absl::StatusOr<std::string> self = cli::SelfBinaryDir();
  if (!self.ok()) {
    std::cerr << "cascade-soak: " << self.status().message() << "\n";
    return 1;
  }
  const fs::path build = fs::path(*self).parent_path();
  const std::string bin_dir = flags.bin_dir.empty() ? (build / "bin").string() : flags.bin_dir;
  absl::StatusOr<std::string> model = cli::PrepareModel(
      flags.model_dir.empty() ? (build / "models" / "tiny").string() : flags.model_dir, "tiny",
      &std::cerr);
  if (!model.ok()) {
    std::cerr << "cascade-soak: " << model.status().message() << "\n";
    return 1;
  }
  std::string log_dir = flags.log_dir;
  if (log_dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "cascade-soak-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::cerr << "cascade-soak: cannot create a log directory\n";
      return 1;
    }
    log_dir = tmpl;
  }
  fs::create_directories(log_dir);
  const std::string up_log = log_dir + "/up.log";
  std::cerr << "logs: " << log_dir << "\n";

  // cascade up, on free loopback ports.
  std::vector<std::string> up_args = {
      "up",
      "--host=127.0.0.1",
      "--port=0",
      absl::StrCat("--workers=", flags.workers),
      "--backend=cpu",
      absl::StrCat("--worker_threads=", flags.worker_threads),
      "--model_dir=" + *model,
      "--log_dir=" + log_dir + "/stack",
      absl::StrCat("--gateway_flag=--max_concurrent=", flags.admitted)};
  up_args.insert(up_args.end(), flags.up_flags.begin(), flags.up_flags.end());
  cli::ChildSpec spec{"cascade", bin_dir + "/cascade", up_args, up_log, "  gateway   "};
  absl::StatusOr<std::unique_ptr<cli::ChildProcess>> up = cli::ChildProcess::Spawn(spec);
  if (!up.ok()) {
    std::cerr << "cascade-soak: " << up.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<std::string> printed = (*up)->WaitReady(absl::Seconds(180));
  if (!printed.ok()) {
    std::cerr << "cascade-soak: cascade up did not come up: " << printed.status().message() << "\n";
    return 1;
  }
  const std::string gateway = cli::DialAddress(*printed);
  if (absl::Status s = CheckLoopback(gateway); !s.ok()) {
    std::cerr << "cascade-soak: " << s.message() << "\n";
    return 1;
  }
  const pid_t up_pid = (*up)->pid();
  std::cerr << "cascade up (pid " << up_pid << ") serves on " << gateway << "\n";

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = cli::Dial(gateway);
  if (!channel.ok()) return 1;
  std::unique_ptr<v2::GatewayService::Stub> stub = v2::GatewayService::NewStub(*channel);
  const absl::Time wait_until = absl::Now() + absl::Seconds(60);
  while (absl::Now() < wait_until) {
    auto models = cli::ListModels(*stub, {absl::Seconds(2), ""});
    if (models.ok() && models->models_size() > 0 && models->models(0).workers() >= flags.workers) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }

  // Cold references, one request at a time on the idle stack.
  const std::vector<v2::GenerateRequest> pool = MakePool(flags);
  std::vector<std::vector<int32_t>> references;
  int short_references = 0;
  const absl::Time ref_start = absl::Now();
  for (size_t i = 0; i < pool.size(); ++i) {
    v2::GenerateRequest r = pool[i];
    r.set_request_id(absl::StrCat("soak-reference-", i));
    absl::StatusOr<cli::GenerateResult> got =
        cli::RunGenerate(*stub, r, {flags.request_timeout, ""});
    if (!got.ok()) {
      std::cerr << "cascade-soak: reference request " << i << " failed: " << got.status().message()
                << "\n";
      (*up)->Stop(absl::Seconds(30));
      return 1;
    }
    if (got->token_ids.size() != static_cast<size_t>(flags.max_tokens)) {
      // The stream finished (LENGTH) but not every token the worker generated reached the
      // client; the reference is what the client got, and the report says so.
      ++short_references;
      std::cerr << "reference " << i << ": only " << got->token_ids.size() << " of "
                << flags.max_tokens << " tokens reached the client (" << cli::FormatSummary(*got)
                << ")\n";
    }
    references.push_back(got->token_ids);
  }
  std::cerr << absl::StrFormat("references: %d requests cold in %.1f s\n", pool.size(),
                               absl::ToDoubleSeconds(absl::Now() - ref_start));

  // Unloaded: the same mix at low concurrency, no cancels, no kills.
  std::cerr << "unloaded phase: " << flags.unloaded_concurrency << " client(s) for "
            << absl::FormatDuration(flags.unloaded_duration) << "\n";
  PromptSource ids({});
  PhaseOptions unloaded_options = PoolPhase(flags, pool, flags.unloaded_concurrency,
                                            flags.unloaded_duration, 0, flags.seed + 1);
  RunPhaseResult unloaded = RunPhaseWithSamples(*stub, ids, unloaded_options, &std::cerr);
  const SoakTally unloaded_tally = TallySoak(unloaded.samples, references);

  const std::vector<ProcessMemory> memory_start = SnapshotMemory(up_pid, flags.workers);

  // Loaded: overload x admitted clients, cancels, kills.
  const int clients = flags.overload * flags.admitted;
  const std::vector<ChaosEvent> schedule =
      ChaosSchedule(flags.duration, flags.workers, flags.worker_kill_interval,
                    flags.registry_kill_interval, flags.registry_kill_offset);
  std::cerr << "loaded phase: " << clients << " clients (" << flags.overload << " x "
            << flags.admitted << " admitted) for " << absl::FormatDuration(flags.duration) << ", "
            << schedule.size() << " kills scheduled\n";
  std::atomic<bool> stop_chaos{false};
  std::vector<ChaosRecord> kills;
  std::thread chaos([&] { kills = RunChaos(up_pid, schedule, stop_chaos, std::cerr); });
  // The processes no kill restarts, sampled through the loaded phase: a leak grows steadily, an
  // allocator warming up levels off.
  std::vector<std::pair<double, std::vector<ProcessMemory>>> memory_trace;
  std::thread memory_sampler([&] {
    const absl::Time start = absl::Now();
    absl::Time next = start + kMemorySampleInterval;
    while (!stop_chaos) {
      if (absl::Now() < next) {
        absl::SleepFor(absl::Milliseconds(100));
        continue;
      }
      memory_trace.emplace_back(absl::ToDoubleSeconds(absl::Now() - start),
                                SnapshotMemory(up_pid, flags.workers));
      next += kMemorySampleInterval;
    }
  });
  PhaseOptions loaded_options =
      PoolPhase(flags, pool, clients, flags.duration, flags.cancel_fraction, flags.seed + 2);
  RunPhaseResult loaded = RunPhaseWithSamples(*stub, ids, loaded_options, &std::cerr);
  stop_chaos = true;
  chaos.join();
  memory_sampler.join();
  const SoakTally loaded_tally = TallySoak(loaded.samples, references);

  // Every killed child should be back before memory is read at the end.
  int64_t kills_done = 0;
  for (const ChaosRecord& k : kills) kills_done += k.pid > 0;
  const absl::Time back_until = absl::Now() + absl::Seconds(60);
  while (absl::Now() < back_until && CountLines(ReadAll(up_log), " is back (") < kills_done) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  const std::vector<ProcessMemory> memory_end = SnapshotMemory(up_pid, flags.workers);

  // Unloaded again after the storm: the stack is back to its baseline (and the baseline itself
  // was not a fluke of the moment it was taken).
  std::cerr << "unloaded phase after the load: " << flags.unloaded_concurrency << " client(s) for "
            << absl::FormatDuration(flags.unloaded_duration) << "\n";
  PhaseOptions after_options = PoolPhase(flags, pool, flags.unloaded_concurrency,
                                         flags.unloaded_duration, 0, flags.seed + 3);
  RunPhaseResult after = RunPhaseWithSamples(*stub, ids, after_options, &std::cerr);
  const SoakTally after_tally = TallySoak(after.samples, references);
  stub.reset();
  channel->reset();
  const bool up_running = (*up)->Running();
  const std::string up_exit = (*up)->Stop(absl::Seconds(60));
  const std::string up_text = ReadAll(up_log);

  // Report (Markdown) on stdout.
  std::ostream& out = std::cout;
  out << "machine: " << DescribeMachine() << "\n"
      << absl::StrFormat(
             "stack: cascade up, %d CPU worker(s) x %d thread(s), tiny model, gateway "
             "--max_concurrent=%d; pool of %d requests (%d tokens each, half sharing a system "
             "chunk, every third seeded temperature 0.8), %d cancelled mid-stream at %.0f%%\n",
             flags.workers, flags.worker_threads, flags.admitted, flags.pool, flags.max_tokens,
             loaded_tally.cancelled, flags.cancel_fraction * 100)
      << "\n| phase | clients | s | requests | admitted | completed | cancelled | lost | wrong "
         "| TTFT p50 ms | TTFT p99 ms | e2e p50 ms | e2e p99 ms | rejected |\n"
      << "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
         "---: | --- |\n";
  PrintTallyRow("unloaded", flags.unloaded_concurrency, unloaded.summary.wall_s, unloaded_tally,
                out);
  PrintTallyRow("loaded + kills", clients, loaded.summary.wall_s, loaded_tally, out);
  PrintTallyRow("unloaded, after", flags.unloaded_concurrency, after.summary.wall_s, after_tally,
                out);
  if (short_references > 0) {
    out << "\nnote: " << short_references << " of " << pool.size()
        << " cold references got fewer tokens than max_tokens (tokens the gateway did not "
           "forward)\n";
  }
  out << absl::StrFormat(
      "\nadmitted p99 under load / unloaded p99: TTFT %s, e2e %s (target: within 3x)\n",
      Ratio(loaded_tally.ttft_ms.p99, unloaded_tally.ttft_ms.p99),
      Ratio(loaded_tally.e2e_ms.p99, unloaded_tally.e2e_ms.p99));
  {
    // Where the tail comes from: streams a kill touched (failed over, or routed while a worker or
    // the registry was restarting) against the rest. The target above is judged on all streams.
    std::vector<double> kill_s;
    for (const ChaosRecord& k : kills) {
      if (k.pid > 0) kill_s.push_back(absl::ToDoubleSeconds(k.actual_at));
    }
    const KillSplit split = SplitByKills(loaded.samples, kill_s, kKillSettleSeconds);
    const SoakTally touched = TallySoak(split.touched, references);
    const SoakTally clear = TallySoak(split.clear, references);
    out << absl::StrFormat(
        "tail by kills (in flight at one, or sent within %.0f s after one): %d admitted, e2e p99 "
        "%s ms; the other %d admitted: TTFT p99 %s ms (%s), e2e p99 %s ms (%s)\n",
        kKillSettleSeconds, touched.admitted, Ms1(touched.e2e_ms.p99, touched.e2e_ms.count),
        clear.admitted, Ms1(clear.ttft_ms.p99, clear.ttft_ms.count),
        Ratio(clear.ttft_ms.p99, unloaded_tally.ttft_ms.p99),
        Ms1(clear.e2e_ms.p99, clear.e2e_ms.count),
        Ratio(clear.e2e_ms.p99, unloaded_tally.e2e_ms.p99));
  }
  out << "\nkills (" << kills.size() << "):";
  for (const ChaosRecord& k : kills) {
    out << absl::StrFormat(" %s@%.0fs(pid %d, %s MiB)", k.event.target,
                           absl::ToDoubleSeconds(k.actual_at), k.pid, Mib(k.rss_bytes));
  }
  out << "\ncascade up: " << CountLines(up_text, "killed by signal") << " deaths logged, "
      << CountLines(up_text, " is back (") << " restarts back, "
      << CountLines(up_text, "Giving up on") << " given up; "
      << (up_running ? "running at the end" : "NOT running at the end") << ", then " << up_exit
      << " on SIGTERM\n";
  out << "\n| process | pid at start | RSS start MiB | pid at end | RSS end MiB |\n"
      << "| --- | ---: | ---: | ---: | ---: |\n";
  for (size_t i = 0; i < memory_start.size() && i < memory_end.size(); ++i) {
    out << absl::StrFormat("| %s | %d | %s | %d | %s |\n", memory_start[i].role,
                           memory_start[i].pid, Mib(memory_start[i].rss), memory_end[i].pid,
                           Mib(memory_end[i].rss));
  }
  // RSS over the loaded phase of the processes that live through it (the first and last rows of
  // the table above are the ends).
  out << "\nRSS MiB through the loaded phase (start, then every "
      << absl::ToInt64Seconds(kMemorySampleInterval) << " s):\n";
  for (size_t row = 0; row < memory_start.size(); ++row) {
    const std::string& role = memory_start[row].role;
    if (role != "cascade up" && role != "gateway" && role != "cascade-soak (clients)") continue;
    out << "  " << role << ": " << Mib(memory_start[row].rss);
    for (const auto& [at_s, snapshot] : memory_trace) {
      if (row < snapshot.size() && snapshot[row].pid == memory_start[row].pid) {
        out << absl::StrFormat(" %s@%.0fs", Mib(snapshot[row].rss), at_s);
      }
    }
    out << "\n";
  }
  std::vector<std::string> examples = unloaded_tally.examples;
  examples.insert(examples.end(), loaded_tally.examples.begin(), loaded_tally.examples.end());
  examples.insert(examples.end(), after_tally.examples.begin(), after_tally.examples.end());
  if (!examples.empty()) {
    out << "\nlost or wrong streams (first ones):\n";
    for (const std::string& e : examples) out << "  " << e << "\n";
  }
  if (!loaded_tally.lost_by.empty())
    out << "lost by code: " << FormatErrors(loaded_tally.lost_by) << "\n";
  const bool clean = unloaded_tally.clean() && loaded_tally.clean() && after_tally.clean();
  const bool up_ok = up_running && up_exit == "exited with code 0";
  out << "\nverdict: " << (clean ? "0 lost, 0 wrong" : "LOST OR WRONG STREAMS")
      << (up_ok ? "" : "; cascade up did not run to the end and exit 0") << "\n";
  std::cerr << "logs: " << log_dir << "\n";
  return clean && up_ok ? 0 : 1;
}

}  // namespace
}  // namespace cascade::bench

int main(int argc, char** argv) { return cascade::bench::Run(argc, argv); }
