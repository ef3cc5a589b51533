// `cascade demo`: starts a local stack, sends requests that share a long system prompt (cold,
// concurrent, warm repeat, and a repeat under another cache_salt), streams the answers, prints
// per-request numbers and the workers' cache counters, and checks that the cached answer and the
// cold answers are the same tokens. Every number printed comes from the running servers.
#include <algorithm>
#include <iostream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "services/cli/cli.h"
#include "services/cli/command_util.h"
#include "services/cli/demo_text.h"
#include "services/cli/gateway_client.h"
#include "services/cli/local_stack.h"

namespace cascade::cli {
namespace {

// Prints several requests' text onto one terminal, each line prefixed with "[n] ". Live mode
// writes every delta as it comes (one request at a time); otherwise lines are written whole when
// complete, so concurrent streams never interleave within a line. Thread-safe.
class LinePrinter {
 public:
  explicit LinePrinter(std::ostream& out) : out_(out) {}
  void SetLive(bool live) {
    absl::MutexLock lock(&mu_);
    live_ = live;
  }
  void Write(int request, std::string_view text) {
    absl::MutexLock lock(&mu_);
    std::string& line = pending_[request];
    for (char c : text) {
      if (c == '\n') {
        EmitLocked(request, &line, /*end_line=*/true);
      } else if (static_cast<unsigned char>(c) < 0x20 && c != '\t') {
        line += "\xEF\xBF\xBD";  // U+FFFD for control characters the model may emit
      } else {
        line += c;
      }
    }
    if (live_) EmitLocked(request, &line, /*end_line=*/false);
  }
  // Ends the request's text and writes `summary` as its own prefixed line.
  void Finish(int request, std::string_view summary) {
    absl::MutexLock lock(&mu_);
    std::string& line = pending_[request];
    if (!line.empty() || open_ == request) EmitLocked(request, &line, /*end_line=*/true);
    out_ << "[" << request << "] " << summary << std::endl;
    pending_.erase(request);
  }

 private:
  void EmitLocked(int request, std::string* text, bool end_line)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (open_ != request) {
      if (open_ != 0) out_ << "\n";
      out_ << "[" << request << "] ";
    }
    out_ << *text;
    text->clear();
    if (end_line) out_ << "\n";
    open_ = end_line ? 0 : request;
    out_ << std::flush;
  }

  absl::Mutex mu_;
  std::ostream& out_ ABSL_GUARDED_BY(mu_);
  bool live_ ABSL_GUARDED_BY(mu_) = true;
  int open_ ABSL_GUARDED_BY(mu_) = 0;  // request whose line is open on the terminal; 0: none
  std::map<int, std::string> pending_ ABSL_GUARDED_BY(mu_);  // text not yet written, per request
};

struct DemoRequest {
  int number = 0;
  std::string step;  // "cold", "concurrent", "warm", "salted"
  std::string query;
  std::string cache_salt;
  absl::StatusOr<GenerateResult> result = absl::UnknownError("not run");
};

struct DemoSettings {
  int max_tokens = 24;
  absl::Duration timeout = absl::Seconds(120);
};

v2::GenerateRequest MakeRequest(const DemoRequest& r, const DemoSettings& s) {
  v2::GenerateRequest req;
  req.set_request_id(absl::StrCat("demo-", r.number));
  req.set_cache_salt(r.cache_salt);
  v2::Chunk* system = req.add_chunks();
  system->set_kind(v2::CHUNK_KIND_SYSTEM);
  system->set_text(DemoSystemPrompt());
  v2::Chunk* query = req.add_chunks();
  query->set_kind(v2::CHUNK_KIND_QUERY);
  query->set_text(r.query);
  req.mutable_sampling()->set_temperature(0);  // greedy: cached and cold must agree exactly
  req.mutable_sampling()->set_seed(1);
  req.mutable_sampling()->set_max_tokens(s.max_tokens);
  return req;
}

void Run(v2::GatewayService::Stub& stub, DemoRequest* r, const DemoSettings& s,
         LinePrinter* printer) {
  r->result = RunGenerate(stub, MakeRequest(*r, s), CallOptions{s.timeout, ""},
                          [&](const v2::GenerateResponse& msg) {
                            if (msg.has_delta()) printer->Write(r->number, msg.delta().text());
                          });
  printer->Finish(r->number,
                  r->result.ok()
                      ? absl::StrCat("(", r->step, ") ", FormatSummary(*r->result))
                      : absl::StrCat("(", r->step, ") FAILED: ", r->result.status().message()));
}

// The gateway learns workers from the registry; wait until it lists all of them (bounded).
void WaitForWorkers(v2::GatewayService::Stub& stub, int workers, std::ostream& err) {
  err << "waiting for the gateway to list " << workers << " worker(s) ..." << std::flush;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::string last = "no answer";
  while (absl::Now() < deadline) {
    absl::StatusOr<v2::ListModelsResponse> models = ListModels(stub, {absl::Seconds(2), ""});
    if (models.ok() && models->models_size() > 0) {
      last = absl::StrCat(models->models(0).workers(), " worker(s)");
      if (models->models(0).workers() >= workers) {
        err << " " << models->models(0).name() << " on " << last << std::endl;
        return;
      }
    } else if (!models.ok()) {
      last = std::string(models.status().message());
      if (models.status().code() == absl::StatusCode::kUnimplemented) break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  err << " going on anyway (" << last << ")" << std::endl;
}

std::string Ids(const std::vector<int32_t>& ids) { return "[" + absl::StrJoin(ids, ", ") + "]"; }

void PrintTable(const std::vector<DemoRequest>& requests, std::ostream& out) {
  out << "\n"
      << absl::StrFormat("%3s  %-10s  %-10s  %7s  %7s  %10s  %8s  %8s  %s\n", "#", "step", "worker",
                         "prompt", "cached", "completion", "TTFT ms", "tok/s", "finish");
  for (const DemoRequest& r : requests) {
    if (!r.result.ok()) {
      out << absl::StrFormat("%3d  %-10s  FAILED: %s\n", r.number, r.step,
                             r.result.status().message());
      continue;
    }
    const GenerateResult& g = *r.result;
    const v2::Usage& u = g.finish.usage();
    out << absl::StrFormat(
        "%3d  %-10s  %-10s  %7d  %7d  %10d  %8s  %8s  %s\n", r.number, r.step, g.start.worker_id(),
        u.prompt_tokens(), u.cached_tokens(), u.completion_tokens(),
        g.ttft_ms >= 0 ? absl::StrFormat("%.1f", g.ttft_ms) : "-",
        g.decode_tokens_per_s >= 0 ? absl::StrFormat("%.1f", g.decode_tokens_per_s) : "-",
        FinishReasonName(g.finish.finish_reason()));
  }
  out << "(TTFT: request sent -> first token, measured by this client; tok/s: decode rate after "
         "the first token)\n";
}

void PrintWorkerStats(const LocalStack& stack, std::ostream& out) {
  out << "\nworker cache counters (cascade.v2.WorkerService/GetStats):\n";
  for (const StackMember& w : stack.workers()) {
    absl::StatusOr<v2::WorkerServiceGetStatsResponse> s =
        GetWorkerStats(w.address, absl::Seconds(5), stack.AdminTls(common::kWorkerServerName));
    if (!s.ok()) {
      out << "  " << w.name << ": " << s.status().message() << "\n";
      continue;
    }
    double pct = s->prefix_cache_queries() > 0
                     ? 100.0 * s->prefix_cache_hits() / s->prefix_cache_queries()
                     : 0.0;
    out << absl::StrFormat(
        "  %s (%s backend): prefix cache hit %d of %d prompt tokens looked up (%.0f%%); "
        "prefilled %d, generated %d; KV blocks %d used, %d cached, %d total (%d tokens each)\n",
        s->worker_id(), s->backend(), s->prefix_cache_hits(), s->prefix_cache_queries(), pct,
        s->prompt_tokens_computed(), s->generation_tokens(), s->used_kv_blocks(),
        s->cached_kv_blocks(), s->total_kv_blocks(), s->block_size());
  }
}

// The acceptance check: warm (cached) and salted (forced cold) repeats of request 1 give its
// tokens, and the caches were really used / really bypassed. Returns the lines to print.
bool CheckCachedEqualsCold(const DemoRequest& cold, const DemoRequest& warm,
                           const DemoRequest& salted, std::ostream& out) {
  std::vector<std::string> problems;
  for (const DemoRequest* r : {&cold, &warm, &salted}) {
    if (!r->result.ok()) {
      problems.push_back(absl::StrCat("request ", r->number, " (", r->step,
                                      ") failed: ", r->result.status().message()));
    }
  }
  if (problems.empty()) {
    const GenerateResult& c = *cold.result;
    const GenerateResult& w = *warm.result;
    const GenerateResult& s = *salted.result;
    if (w.finish.usage().cached_tokens() <= 0) {
      problems.push_back(absl::StrCat("request ", warm.number,
                                      " repeated request 1 but reported 0 cached tokens: the "
                                      "prefix cache was not used"));
    }
    if (s.finish.usage().cached_tokens() != 0) {
      problems.push_back(absl::StrCat(
          "request ", salted.number, " used cache_salt \"", salted.cache_salt, "\" yet reported ",
          s.finish.usage().cached_tokens(), " cached tokens: salts must not share cache"));
    }
    for (const DemoRequest* r : {&warm, &salted}) {
      if (r->result->token_ids != c.token_ids) {
        problems.push_back(absl::StrCat(
            "request ", r->number, " (", r->step, ", ", r->result->finish.usage().cached_tokens(),
            " cached) differs from cold request ", cold.number, ":\n    cold:  ", Ids(c.token_ids),
            "\n    ", r->step, ": ", Ids(r->result->token_ids)));
      }
    }
    if (problems.empty()) {
      out << absl::StrFormat(
                 "\ncached == cold: OK (request %d reused %d of %d prompt tokens on %s; request "
                 "%d, under another cache_salt, reused %d on %s; both produced exactly the %d "
                 "tokens of cold request %d on %s)",
                 warm.number, w.finish.usage().cached_tokens(), w.finish.usage().prompt_tokens(),
                 w.start.worker_id(), salted.number, s.finish.usage().cached_tokens(),
                 s.start.worker_id(), c.token_ids.size(), cold.number, c.start.worker_id())
          << std::endl;
      return true;
    }
  }
  out << "\ncached == cold: FAILED\n";
  for (const std::string& p : problems) out << "  " << p << "\n";
  out << std::flush;
  return false;
}

}  // namespace

int RunDemoCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  StackOptions options;
  options.workers = 2;
  std::string model_dir;
  int requests = 6;
  DemoSettings settings;
  common::FlagSet flags(
      "cascade demo",
      "Starts registry, workers and gateway on free ports, sends requests sharing a long system "
      "prompt (cold, concurrent, a warm repeat, a repeat under another cache_salt), streams the "
      "answers, prints per-request and per-worker cache numbers, checks that cached and cold "
      "answers are the same tokens (exit 1 if not), and stops the stack.");
  flags.AddInt("workers", &options.workers, "number of cascade-worker processes");
  flags.AddString("backend", &options.backend, "worker backend: cpu | cuda | auto");
  flags.AddString("model_dir", &model_dir,
                  "model to serve; empty: <build>/models/tiny, generated when absent");
  flags.AddInt("requests", &requests,
               "requests in all: 1 cold, requests - 3 concurrent, 1 warm repeat, 1 salted repeat");
  flags.AddInt("max_tokens", &settings.max_tokens, "tokens per answer");
  flags.AddInt64("kv_cache_bytes", &options.kv_cache_bytes,
                 "KV cache budget per worker; 0: the worker's default");
  flags.AddDuration("timeout", &settings.timeout, "deadline of each request");
  flags.AddBool("insecure_internal", &options.insecure_internal,
                "run the registry and workers without internal auth (plaintext, no roles)");
  if (std::optional<int> code = ParseCommandFlags(flags, args, out, err)) return *code;
  if (options.workers < 1 || options.workers > 16 || requests < 4 || requests > 64 ||
      settings.max_tokens < 1) {
    err << "cascade demo: need --workers in [1, 16], --requests in [4, 64], --max_tokens >= 1\n";
    return kExitUsage;
  }

  const bool generated_model = model_dir.empty();
  absl::StatusOr<std::string> model = PrepareModel(model_dir, "tiny", &err);
  if (!model.ok()) {
    err << "cascade demo: " << model.status().message() << "\n";
    return kExitFailed;
  }
  options.model_dir = *model;
  absl::StatusOr<std::unique_ptr<LocalStack>> stack = LocalStack::Start(options, &err);
  if (!stack.ok()) {
    err << "cascade demo: " << stack.status().message() << "\n";
    return kExitFailed;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Dial((*stack)->gateway().address);
  if (!channel.ok()) {
    err << "cascade demo: " << channel.status().message() << "\n";
    return kExitFailed;
  }
  std::unique_ptr<v2::GatewayService::Stub> stub = v2::GatewayService::NewStub(*channel);
  WaitForWorkers(*stub, options.workers, err);

  const std::vector<std::string>& queries = DemoQueries();
  std::vector<DemoRequest> reqs(requests);
  for (int i = 0; i < requests; ++i) {
    reqs[i].number = i + 1;
    reqs[i].step = i == 0 ? "cold" : "concurrent";
    reqs[i].query = queries[i % queries.size()];
  }
  DemoRequest& cold = reqs[0];
  DemoRequest& warm = reqs[requests - 2];
  DemoRequest& salted = reqs[requests - 1];
  warm.step = "warm";
  warm.query = cold.query;
  salted.step = "salted";
  salted.query = cold.query;
  salted.cache_salt = "demo-other-tenant";

  out << "\nEvery request: one SYSTEM chunk (" << DemoSystemPrompt().size()
      << " characters, the same for all) + one QUERY chunk; greedy, " << settings.max_tokens
      << " tokens at most.\n";
  if (generated_model) {
    out << "Note: the tiny model has random weights: its text is meaningless; what matters is "
           "that cached and cold agree.\n";
  }
  LinePrinter printer(out);
  out << "\n(1) cold: request 1, nothing cached yet\n" << std::flush;
  Run(*stub, &cold, settings, &printer);

  out << "\n(2) concurrent: "
      << (requests == 4 ? "request 2" : absl::StrCat("requests 2-", requests - 2, " at once"))
      << ", same system prompt, different questions\n"
      << std::flush;
  printer.SetLive(false);  // whole lines only while streams run at once
  std::vector<std::thread> threads;
  for (int i = 1; i < requests - 2; ++i) {
    threads.emplace_back([&, i] { Run(*stub, &reqs[i], settings, &printer); });
  }
  for (std::thread& t : threads) t.join();
  printer.SetLive(true);

  out << "\n(3) warm: request " << warm.number << " repeats request 1 (should hit the cache)\n"
      << std::flush;
  Run(*stub, &warm, settings, &printer);
  out << "\n(4) salted: request " << salted.number << " repeats request 1 under cache_salt \""
      << salted.cache_salt << "\" (shares no cache: a cold prefill)\n"
      << std::flush;
  Run(*stub, &salted, settings, &printer);

  PrintTable(reqs, out);
  PrintWorkerStats(**stack, out);
  bool ok = CheckCachedEqualsCold(cold, warm, salted, out);
  for (const DemoRequest& r : reqs) {
    if (r.result.ok()) continue;
    out << "FAILED: request " << r.number << " (" << r.step << "): " << r.result.status().message()
        << std::endl;
    ok = false;
  }
  if (std::optional<std::string> dead = (*stack)->FindDeadChild()) {
    err << "cascade demo: " << *dead;
    ok = false;
  }
  // Close our connection first: an idle client channel slows the gateway's drain (gRPC 1.51's
  // client backup poller keeps the connection for about 5 s).
  stub.reset();
  channel->reset();
  (*stack)->Stop(&err);
  if (!ok || !(*stack)->RemoveOwnLogDir()) {
    err << "cascade demo: the servers' logs are in " << (*stack)->log_dir() << "/" << std::endl;
  }
  return ok ? kExitOk : kExitFailed;
}

}  // namespace cascade::cli
