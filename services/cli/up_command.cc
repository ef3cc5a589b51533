// `cascade up`: runs registry, workers and gateway as child processes until SIGINT/SIGTERM,
// restarting any that dies (the others keep serving), and prints what to paste to talk to them.
#include <signal.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/internal_auth.h"
#include "services/cli/cli.h"
#include "services/cli/command_util.h"
#include "services/cli/local_stack.h"

namespace cascade::cli {
namespace {

// Blocks SIGINT and SIGTERM in this thread, and so in every thread it starts later, so they can
// be taken with sigtimedwait(); restores the previous mask when destroyed.
class BlockStopSignals {
 public:
  BlockStopSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~BlockStopSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  // The signal that arrived within `timeout_ms`, or 0.
  int Wait(int timeout_ms) {
    timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
    int sig = sigtimedwait(&set_, nullptr, &ts);
    return sig > 0 ? sig : 0;
  }

 private:
  sigset_t set_;
  sigset_t old_;
};

void PrintExamples(const LocalStack& stack, int http_port, std::ostream& out) {
  const int port = stack.gateway_port();
  // States() is in start order: registry, workers, gateway.
  const std::vector<ChildState> states = stack.States();
  auto pid = [&](size_t i) { return i < states.size() ? states[i].pid : -1; };
  out << "\nCascade is up.\n"
      << "  gateway   " << stack.gateway().address << "  (cascade.v2.GatewayService, pid "
      << pid(states.size() - 1) << ")\n"
      << "  registry  " << stack.registry().address << "  (pid " << pid(0) << ")\n";
  for (size_t i = 0; i < stack.workers().size(); ++i) {
    out << "  " << stack.workers()[i].name << "  " << stack.workers()[i].address << "  (pid "
        << pid(i + 1) << ")\n";
  }
  out << "  logs      " << stack.log_dir() << "/\n";
  // The registry's and workers' RPCs are internal: only cluster certificates get in.
  std::string internal_grpcurl = "grpcurl -plaintext";
  if (const auto& certs = stack.certs()) {
    out << "  certs     " << certs->dir << "/  (internal auth: a CA and a certificate per role)\n";
    internal_grpcurl =
        absl::StrCat("grpcurl -cacert ", certs->ca(), " -cert ", certs->cert("admin"), " -key ",
                     certs->key("admin"), " -servername ", common::kRegistryServerName);
  } else {
    out << "  certs     none: --insecure_internal (anyone reaching the registry or a worker may "
           "call any RPC)\n";
  }
  out << "\n"
      << "Try:\n"
      << "  grpcurl -plaintext localhost:" << port << " list\n"
      << "  grpcurl -plaintext localhost:" << port << " grpc.health.v1.Health/Check\n"
      << "  grpcurl -plaintext -d '{\"chunks\": ["
      << "{\"kind\": \"CHUNK_KIND_SYSTEM\", \"text\": \"You are a concise assistant.\"}, "
      << "{\"kind\": \"CHUNK_KIND_QUERY\", \"text\": \"What does a prefix cache save?\"}], "
      << "\"sampling\": {\"max_tokens\": 32, \"temperature\": 0}}' localhost:" << port
      << " cascade.v2.GatewayService/Generate\n"
      << "  cascade generate --gateway localhost:" << port
      << " --system 'You are a concise assistant.' --query 'What does a prefix cache save?'"
         " --max_tokens 32 --temperature 0\n"
      << "  " << internal_grpcurl << " " << stack.registry().address
      << " cascade.v2.ChunkRegistryService/ListWorkers\n"
      << "  cascade demo   (its own stack on free ports)\n";
  if (http_port > 0) {
    out << "  curl http://localhost:" << http_port << "/v1/chat/completions -H 'Content-Type: "
        << "application/json' -d '{\"messages\": [{\"role\": \"user\", \"content\": "
        << "\"Hi\"}], \"max_tokens\": 16}'   (OpenAI API at http://localhost:" << http_port
        << "/v1)\n";
  }
  out << "\n"
      << "A child that dies is restarted on its port (--max_restarts, --restart_backoff).\n"
      << "Ctrl-C stops everything." << std::endl;
}

}  // namespace

int RunUpCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  StackOptions options;
  options.port = 50051;
  std::string model_dir, preset = "tiny";
  common::FlagSet flags(
      "cascade up",
      "Starts a local Cascade stack as child processes (cascade-registry, cascade-worker x N, "
      "cascade-gateway, from this binary's directory), prints the addresses and grpcurl "
      "examples, and runs until Ctrl-C or SIGTERM, then stops the children gracefully. A child "
      "that dies is logged and restarted on the same port with exponential backoff while the "
      "others keep serving (streams on a dead worker resume on another one); one that keeps "
      "dying is given up on.");
  flags.AddInt("port", &options.port, "gateway port; 0: a free one");
  flags.AddString("host", &options.host,
                  "gateway listen address (0.0.0.0 to accept remote "
                  "clients)");
  flags.AddInt("workers", &options.workers,
               "number of cascade-worker processes; CUDA workers spread over the visible GPUs "
               "(worker i on GPU i mod N, sharers of a GPU split its KV memory)");
  flags.AddString("model_dir", &model_dir,
                  "model to serve; empty: <build>/models/<preset>, generated when absent");
  flags.AddString("preset", &preset,
                  "preset to generate when the model directory is empty "
                  "(tiny | qwen3-0.6b | llama-tiny | qwen3-8b | llama-3.2-1b)");
  flags.AddString("backend", &options.backend, "worker backend: cpu | cuda | auto");
  flags.AddInt64("kv_cache_bytes", &options.kv_cache_bytes,
                 "KV cache budget per worker; 0: the worker's default");
  flags.AddInt("worker_threads", &options.worker_threads,
               "CPU backend threads per worker; 0: cores / workers");
  flags.AddInt("registry_port", &options.registry_port, "registry port; 0: a free one");
  flags.AddInt("worker_base_port", &options.worker_base_port,
               "worker i listens on this + i; 0: free ports");
  flags.AddString("log_dir", &options.log_dir,
                  "children's logs; empty: a new $TMPDIR/cascade-* (else /tmp), removed when "
                  "cascade up stops and no child died");
  flags.AddString("certs_dir", &options.certs_dir,
                  "where the throwaway internal CA and certificates go; empty: <log_dir>/certs");
  flags.AddBool("insecure_internal", &options.insecure_internal,
                "run the registry and workers without internal auth: plaintext, no roles, and "
                "anyone who reaches their ports may call any RPC");
  flags.AddDuration("ready_timeout", &options.ready_timeout,
                    "how long each child may take to print its ready line");
  RestartOptions& restart = options.restart;
  flags.AddDuration("restart_backoff", &restart.initial_backoff,
                    "wait before restarting a dead child; doubles with each quick death");
  flags.AddDuration("restart_backoff_max", &restart.max_backoff, "the wait never exceeds this");
  flags.AddDuration("restart_stable_after", &restart.stable_after,
                    "a child up this long is healthy again (its backoff starts over)");
  flags.AddInt("max_restarts", &restart.max_restarts,
               "restarts in a row, each dying before --restart_stable_after, before giving up on "
               "a child (0: never restart)");
  flags.AddInt("http_port", &options.http_port,
               "the gateway's OpenAI-compatible HTTP API on this port (/v1/...); 0: a free one "
               "(the banner names it); -1: off");
  AddRepeatedString(&flags, "registry_flag", &options.registry_flags,
                    "extra flag for cascade-registry, e.g. --registry_flag=--lease_ms=5000");
  AddRepeatedString(&flags, "worker_flag", &options.worker_flags,
                    "extra flag for every cascade-worker, e.g. --worker_flag=--max_batch=64");
  AddRepeatedString(&flags, "gateway_flag", &options.gateway_flags,
                    "extra flag for cascade-gateway, e.g. --gateway_flag=--max_concurrent=32");
  if (std::optional<int> code = ParseCommandFlags(flags, args, out, err)) return *code;
  if (options.http_port < -1 || options.http_port > 65535) {
    err << "cascade up: --http_port must be a port number (1-65535), 0 for a free one, or -1 "
           "for off\n";
    return kExitUsage;
  }
  if (options.backend == "cpu") {
    // CPU workers batch poorly (each sequence adds almost its whole cost to a step), so their
    // admission limits start low and hold decode within 1.3x of unloaded (with no absolute time
    // per token under which the limit may grow regardless), and a request waits
    // for room only briefly (a CPU request's whole life is a few hundred ms); the gateway's
    // defaults suit GPU workers, whose steps barely slow with batch size. Flags given with
    // --gateway_flag come later and win.
    options.gateway_flags.insert(
        options.gateway_flags.begin(),
        {"--admission_initial_limit=4", "--admission_latency_tolerance=1.3",
         "--admission_tpot_target=0", "--queue_timeout=100ms", "--standing_queue=200ms",
         "--overload_queue_timeout=20ms"});
  }
  if (options.workers < 1 || options.workers > 64) {
    err << "cascade up: --workers must be in [1, 64]\n";
    return kExitUsage;
  }
  if (std::string bad = ValidateRestartOptions(restart); !bad.empty()) {
    err << "cascade up: " << bad << "\n";
    return kExitUsage;
  }

  // Before any thread exists (child readers, gRPC), so that all of them inherit the mask.
  BlockStopSignals signals;
  absl::StatusOr<std::string> model = PrepareModel(model_dir, preset, &err);
  if (!model.ok()) {
    err << "cascade up: " << model.status().message() << "\n";
    return kExitFailed;
  }
  options.model_dir = *model;
  absl::StatusOr<std::unique_ptr<LocalStack>> stack = LocalStack::Start(options, &err);
  if (!stack.ok()) {
    err << "cascade up: " << stack.status().message() << "\n";
    return kExitFailed;
  }
  PrintExamples(**stack, (*stack)->http_port(), out);

  int code = kExitOk;
  while (true) {
    if (int sig = signals.Wait(100); sig != 0) {
      err << "\ncascade up: " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ", stopping"
          << std::endl;
      break;
    }
    (*stack)->Supervise(&err);
    if (!(*stack)->CanServe()) {
      err << "cascade up: nothing left that can serve (the gateway, or every worker, was given "
             "up on); stopping the rest"
          << std::endl;
      code = kExitFailed;
      break;
    }
  }
  // The logs of a run in which a child died are kept: they say why. A clean run leaves nothing.
  bool died = false;
  for (const ChildState& s : (*stack)->States()) {
    died |= s.restarts > 0 || s.phase != ChildState::Phase::kServing;
  }
  (*stack)->Stop(&err);
  if (died || code != kExitOk || !(*stack)->RemoveOwnLogDir()) {
    err << "cascade up: the children's logs are in " << (*stack)->log_dir() << "/" << std::endl;
  }
  return code;
}

}  // namespace cascade::cli
