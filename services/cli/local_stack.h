// A whole Cascade deployment on this machine, as child processes of the caller: one
// cascade-registry, N cascade-worker, one cascade-gateway, started in that order (each waits
// for the previous one's ready line, whose real port it needs) and stopped in reverse.
// What `cascade up`, `cascade demo` and the CLI's integration test run. `cascade up` also
// supervises the children (Supervise): a dead one is restarted on the same port with backoff
// while the others keep serving.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cert_gen.h"
#include "common/internal_auth.h"
#include "services/cli/child_process.h"
#include "services/cli/restart_policy.h"

namespace cascade::cli {

struct StackOptions {
  std::string bin_dir;    // where the server binaries are; empty: this executable's directory
  std::string model_dir;  // REQUIRED: an existing model directory (see EnsureModel)
  std::string host = "127.0.0.1";  // the gateway's listen host (the others use 127.0.0.1)
  int port = 0;                    // gateway port; 0: a free one
  int http_port = -1;              // the gateway's OpenAI HTTP API: -1 off, 0 a free port
  int workers = 1;
  std::string backend = "auto";  // cpu | cuda | auto
  int64_t kv_cache_bytes = 0;    // per worker; 0: the worker's default
  int worker_threads = 0;        // CPU backend threads per worker; 0: cores / workers
  int registry_port = 0;         // 0: a free one
  int worker_base_port = 0;      // > 0: worker i listens on base + i; 0: free ports
  std::string log_dir;  // children's logs; empty: a new $TMPDIR/cascade-XXXXXX (RemoveOwnLogDir)
  absl::Duration ready_timeout = absl::Seconds(120);
  absl::Duration stop_grace = absl::Seconds(15);  // per child, before SIGKILL
  RestartOptions restart;                         // what Supervise() does with a dead child
  // Internal RPCs (registry, workers) run with mTLS and roles: a throwaway CA and a certificate
  // per child are made in certs_dir (empty: <log_dir>/certs), with admin.crt/admin.key for the
  // operator. insecure_internal passes --insecure_internal to every child instead.
  bool insecure_internal = false;
  std::string certs_dir;
  // Extra flags appended to each kind of child's command line (after the stack's own).
  std::vector<std::string> registry_flags;
  std::vector<std::string> worker_flags;
  std::vector<std::string> gateway_flags;
};

// GPUs the CUDA driver will show a child: the entries of CUDA_VISIBLE_DEVICES when it is set
// (`visible_env`, null when unset), otherwise the GPUs under `proc_gpus_dir`
// (/proc/driver/nvidia/gpus, one folder per GPU while the driver is loaded); 0 when neither.
int CountVisibleGpus(const char* visible_env, const std::string& proc_gpus_dir);

// One worker per GPU: worker i runs on GPU i mod `gpus`, and when workers outnumber GPUs, each
// worker on a shared GPU gets an equal share of its KV memory. Empty when `gpus` is 0.
struct GpuPlacement {
  int device = 0;
  double kv_cache_fraction = 0.8;
};
std::vector<GpuPlacement> PlaceWorkersOnGpus(int workers, int gpus);

// One supervised child as Supervise() sees it.
struct ChildState {
  enum class Phase { kServing, kStarting, kWaitingToRestart, kGaveUp };
  std::string role;  // "registry", "worker-0", "gateway"
  Phase phase = Phase::kServing;
  pid_t pid = -1;    // the current (or last) process
  int restarts = 0;  // successful and failed restarts so far
};
// "serving", "starting", "waiting to restart", "given up".
const char* PhaseName(ChildState::Phase phase);

struct StackMember {
  std::string name;     // "cascade-registry", "worker-0", "cascade-gateway"
  std::string address;  // what a local client dials: 127.0.0.1:PORT
};

// Not thread-safe. REQUIRES: Start() and Stop() on the main thread (see ChildProcess).
class LocalStack {
 public:
  // Starts every child or none: on an error the ones already started are stopped. Progress
  // lines go to `progress` (may be null).
  static absl::StatusOr<std::unique_ptr<LocalStack>> Start(const StackOptions& options,
                                                           std::ostream* progress);
  // Stops what still runs.
  ~LocalStack();

  // Gateway, then workers, then registry: SIGTERM, wait up to stop_grace, SIGKILL.
  void Stop(std::ostream* progress);
  // The first child that is no longer running, described with its log's tail; nullopt if all run.
  std::optional<std::string> FindDeadChild();

  // One non-blocking round of supervision; call it every ~100 ms from the thread that called
  // Start(). A child found dead is logged and, after its backoff, restarted with the same
  // arguments on the same port (so the others' addresses stay valid); a restarted child that
  // prints its ready line is logged as back; one that crash-loops (RestartOptions::max_restarts)
  // is given up on. Lines go to `log` (may be null).
  void Supervise(std::ostream* log);
  // Where each child stands, in start order.
  std::vector<ChildState> States() const;
  // False once nothing can serve any more: the gateway, or every worker, was given up on.
  bool CanServe() const;

  const StackMember& registry() const { return registry_; }
  const std::vector<StackMember>& workers() const { return workers_; }
  const StackMember& gateway() const { return gateway_; }
  int gateway_port() const { return PortOf(gateway_.address); }
  // The port of the gateway's OpenAI HTTP API (the one it bound where StackOptions::http_port
  // was 0; a restarted gateway listens there again), or -1 when it is off.
  int http_port() const { return http_port_; }
  const std::string& log_dir() const { return log_dir_; }
  // Removes the log directory when Start() made it (StackOptions::log_dir empty), with the
  // children's logs and the certificates in it; one the caller named stays. Call it after Stop(),
  // when the run went well: the logs of a failed one are the evidence. True when it removed it.
  bool RemoveOwnLogDir();
  // The stack's internal certificates; nullopt with insecure_internal.
  const std::optional<common::StackCertPaths>& certs() const { return certs_; }
  // Client TLS as admin to an internal server named `server_name` (plaintext when insecure).
  common::ClientTlsOptions AdminTls(std::string_view server_name) const;

 private:
  LocalStack() = default;
  struct Slot {
    ChildSpec spec;  // --port= holds the real port once the first start printed it
    std::unique_ptr<ChildProcess> child;
    ChildState state;
    RestartPolicy policy;
    absl::Time since;  // kStarting: when spawned; kWaitingToRestart: when to restart
  };
  absl::StatusOr<std::string> StartChild(const std::string& binary, const std::string& log_name,
                                         std::vector<std::string> args, std::ostream* progress,
                                         std::vector<std::string> note_markers = {});
  void SuperviseSlot(Slot& slot, absl::Time now, std::ostream* log);
  void OnSlotDeath(Slot& slot, absl::Time now, const std::string& how, std::ostream* log);

  StackOptions options_;
  std::string log_dir_;
  bool own_log_dir_ = false;  // made by Start() under the temp dir
  std::optional<common::StackCertPaths> certs_;
  StackMember registry_;
  std::vector<StackMember> workers_;
  StackMember gateway_;
  int http_port_ = -1;
  std::vector<Slot> slots_;  // in start order
};

// The directory of the running executable (/proc/self/exe).
absl::StatusOr<std::string> SelfBinaryDir();
// Where `up`/`demo` keep a generated model: <bin_dir>/../models/<preset> (build/models/tiny).
std::string DefaultModelDir(const std::string& bin_dir, const std::string& preset);
// True when `dir` holds a config.json.
bool ModelExists(const std::string& dir);
// Generates the preset into `dir` (random weights, seed 0) unless a model is there already.
// Progress (what and where, and how long it took) goes to `progress` (may be null).
absl::Status EnsureModel(const std::string& dir, const std::string& preset, std::ostream* progress);
// The model directory `up`/`demo` serve: `model_dir`, or DefaultModelDir() of this executable
// when empty; generated from `preset` when it has no model yet. Returns the absolute path.
absl::StatusOr<std::string> PrepareModel(const std::string& model_dir, const std::string& preset,
                                         std::ostream* progress);

}  // namespace cascade::cli
