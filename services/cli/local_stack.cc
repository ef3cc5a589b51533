// Starting and stopping a local registry + workers + gateway as child processes.
#include "services/cli/local_stack.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <ostream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gpu_worker/model/generator.h"

namespace cascade::cli {
namespace fs = std::filesystem;
namespace {

std::vector<std::string> WithExtra(std::vector<std::string> args,
                                   const std::vector<std::string>& extra) {
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Replaces the first "<flag>=..." in `args` (the stack always passes --port) with `port`.
void PinPort(std::vector<std::string>& args, int port, const char* flag = "--port") {
  const std::string prefix = absl::StrCat(flag, "=");
  for (std::string& a : args) {
    if (a.rfind(prefix, 0) == 0) {
      a = absl::StrCat(prefix, port);
      return;
    }
  }
}

// The gateway's line naming its OpenAI HTTP address, printed before its ready line.
constexpr char kHttpMarker[] = "cascade-gateway OpenAI HTTP API on http://";

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d));
}

}  // namespace

int CountVisibleGpus(const char* visible_env, const std::string& proc_gpus_dir) {
  if (visible_env != nullptr) {
    // "0,1", "GPU-uuid,..."; "" or "-1" hides every GPU. CUDA stops at the first invalid entry;
    // counting the entries before a negative one is the same for the values people write.
    int n = 0;
    for (absl::string_view part : absl::StrSplit(visible_env, ',', absl::SkipWhitespace())) {
      if (absl::StartsWith(absl::StripAsciiWhitespace(part), "-")) break;
      ++n;
    }
    return n;
  }
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it(proc_gpus_dir, ec), end; !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return n;
}

std::vector<GpuPlacement> PlaceWorkersOnGpus(int workers, int gpus) {
  std::vector<GpuPlacement> out;
  if (gpus <= 0) return out;
  constexpr double kKvShare = 0.8;  // the worker's default --kv_cache_fraction
  for (int i = 0; i < workers; ++i) {
    const int device = i % gpus;
    const int sharers = workers / gpus + (device < workers % gpus ? 1 : 0);
    const int before = i / gpus;  // sharers of this GPU started earlier (workers start in order)
    // Each sharer should end with kKvShare / sharers of the memory; the j-th sees what the j
    // before it left, so it asks for that amount as a fraction of what is still free.
    const double share = kKvShare / sharers;
    out.push_back({device, share / (1.0 - before * share)});
  }
  return out;
}

const char* PhaseName(ChildState::Phase phase) {
  switch (phase) {
    case ChildState::Phase::kServing:
      return "serving";
    case ChildState::Phase::kStarting:
      return "starting";
    case ChildState::Phase::kWaitingToRestart:
      return "waiting to restart";
    case ChildState::Phase::kGaveUp:
      return "given up";
  }
  return "?";
}

absl::StatusOr<std::string> SelfBinaryDir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot read /proc/self/exe: ", ec.message()));
  return exe.parent_path().string();
}

std::string DefaultModelDir(const std::string& bin_dir, const std::string& preset) {
  return (fs::path(bin_dir).parent_path() / "models" / preset).lexically_normal().string();
}

bool ModelExists(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "config.json", ec);
}

absl::Status EnsureModel(const std::string& dir, const std::string& preset,
                         std::ostream* progress) {
  if (ModelExists(dir)) {
    if (progress) *progress << "model: " << dir << " (already there)" << std::endl;
    return absl::OkStatus();
  }
  if (progress) {
    *progress << "model: generating the '" << preset << "' preset (random weights, seed 0) into "
              << dir << " ..." << std::endl;
  }
  const absl::Time start = absl::Now();
  // Generated into a sibling temp dir and renamed into place, so that two `cascade up` (or two
  // tests) making the same default model at once never load a half-written one: a rename onto
  // a directory the other one finished first fails, and that model is used.
  std::error_code ec;
  const fs::path target(dir);
  fs::create_directories(target.parent_path(), ec);
  std::string tmp = (target.parent_path() / (target.filename().string() + ".tmp-XXXXXX")).string();
  if (mkdtemp(tmp.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("generating the model in ", dir, ": cannot create a temp dir beside it"));
  }
  model::MkmodelOptions mk;
  mk.preset = preset;
  mk.out_dir = tmp;
  absl::Status made = model::RunMkmodel(mk);
  if (made.ok() && std::rename(tmp.c_str(), dir.c_str()) != 0) {
    const int err = errno;
    if (!ModelExists(dir)) {
      made = absl::InternalError(
          absl::StrCat("moving the model into ", dir, ": ", std::strerror(err)));
    } else if (progress) {
      *progress << "model: " << dir << " (made meanwhile by another process)" << std::endl;
    }
  }
  fs::remove_all(tmp, ec);  // what is left of it when the rename did not happen
  if (!made.ok()) {
    return absl::Status(made.code(),
                        absl::StrCat("generating the model in ", dir, ": ", made.message()));
  }
  if (progress) {
    *progress << absl::StrFormat("model: done in %.1f s",
                                 absl::ToDoubleSeconds(absl::Now() - start))
              << std::endl;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PrepareModel(const std::string& model_dir, const std::string& preset,
                                         std::ostream* progress) {
  std::string dir = model_dir;
  if (dir.empty()) {
    absl::StatusOr<std::string> bin_dir = SelfBinaryDir();
    if (!bin_dir.ok()) return bin_dir.status();
    dir = DefaultModelDir(*bin_dir, preset);
  }
  dir = fs::absolute(dir).lexically_normal().string();
  if (absl::Status s = EnsureModel(dir, preset, progress); !s.ok()) return s;
  return dir;
}

absl::StatusOr<std::unique_ptr<LocalStack>> LocalStack::Start(const StackOptions& options,
                                                              std::ostream* progress) {
  if (options.workers < 1) return absl::InvalidArgumentError("--workers must be at least 1");
  if (!ModelExists(options.model_dir)) {
    return absl::NotFoundError(absl::StrCat(options.model_dir,
                                            " has no config.json: make a model "
                                            "with `cascade mkmodel --preset tiny --out DIR`"));
  }
  std::unique_ptr<LocalStack> stack(new LocalStack());
  stack->options_ = options;
  StackOptions& o = stack->options_;
  if (o.bin_dir.empty()) {
    absl::StatusOr<std::string> dir = SelfBinaryDir();
    if (!dir.ok()) return dir.status();
    o.bin_dir = *dir;
  }
  o.model_dir = fs::absolute(o.model_dir).lexically_normal().string();
  if (o.log_dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "cascade-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError("cannot create a log directory under " +
                                 fs::temp_directory_path().string());
    }
    o.log_dir = tmpl;
    stack->own_log_dir_ = true;
  } else {
    std::error_code ec;
    fs::create_directories(o.log_dir, ec);
    if (ec)
      return absl::InternalError(absl::StrCat("cannot create ", o.log_dir, ": ", ec.message()));
  }
  stack->log_dir_ = o.log_dir;
  if (progress) *progress << "logs: " << o.log_dir << "/*.log" << std::endl;

  std::vector<std::string> worker_ids;
  for (int i = 0; i < o.workers; ++i) worker_ids.push_back(absl::StrCat("worker-", i));
  // Each child's --internal_* flags (or --insecure_internal); role is "registry" or "gateway",
  // or a worker id.
  auto auth_flags = [&stack](const std::string& role, bool worker) -> std::vector<std::string> {
    if (!stack->certs_) return {"--insecure_internal"};
    const common::StackCertPaths& c = *stack->certs_;
    return {"--internal_ca=" + c.ca(),
            "--internal_cert=" + (worker ? c.worker_cert(role) : c.cert(role)),
            "--internal_key=" + (worker ? c.worker_key(role) : c.key(role))};
  };
  if (!o.insecure_internal) {
    const std::string dir = o.certs_dir.empty() ? o.log_dir + "/certs" : o.certs_dir;
    absl::StatusOr<common::StackCertPaths> certs =
        common::WriteStackCerts(dir, {.worker_ids = worker_ids});
    if (!certs.ok()) {
      return absl::Status(certs.status().code(),
                          absl::StrCat("making internal certificates: ", certs.status().message()));
    }
    stack->certs_ = *certs;
    if (progress) {
      *progress << "internal auth: a throwaway CA and certificates in " << dir
                << " (admin.crt/admin.key for admin RPCs)" << std::endl;
    }
  }

  // Registry first: the workers and the gateway need its real port.
  std::vector<std::string> registry_args = {
      "--host=127.0.0.1", absl::StrCat("--port=", o.registry_port), "--drain_timeout=3s"};
  for (std::string& f : auth_flags("registry", false)) registry_args.push_back(std::move(f));
  absl::StatusOr<std::string> addr =
      stack->StartChild("cascade-registry", "registry",
                        WithExtra(std::move(registry_args), o.registry_flags), progress);
  if (!addr.ok()) return addr.status();
  stack->registry_ = {"cascade-registry", *addr};

  int threads = o.worker_threads;
  if (threads <= 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / o.workers);
  }
  // CUDA workers spread over the GPUs (cpu: none; auto: the worker picks CUDA when it sees one).
  std::vector<GpuPlacement> gpus;
  if (o.backend != "cpu") {
    gpus = PlaceWorkersOnGpus(o.workers, CountVisibleGpus(std::getenv("CUDA_VISIBLE_DEVICES"),
                                                          "/proc/driver/nvidia/gpus"));
  }
  for (int i = 0; i < o.workers; ++i) {
    const std::string& id = worker_ids[i];
    std::vector<std::string> args = {
        "--host=127.0.0.1",
        absl::StrCat("--port=", o.worker_base_port > 0 ? o.worker_base_port + i : 0),
        "--model_dir=" + o.model_dir,
        "--registry=" + stack->registry_.address,
        "--worker_id=" + id,
        "--backend=" + o.backend,
        absl::StrCat("--threads=", threads),
        "--drain_timeout=5s"};
    if (o.kv_cache_bytes > 0) args.push_back(absl::StrCat("--kv_cache_bytes=", o.kv_cache_bytes));
    if (!gpus.empty()) {
      args.push_back(absl::StrCat("--cuda_device=", gpus[i].device));
      args.push_back(absl::StrFormat("--kv_cache_fraction=%.4f", gpus[i].kv_cache_fraction));
    }
    for (std::string& f : auth_flags(id, true)) args.push_back(std::move(f));
    addr = stack->StartChild("cascade-worker", id, WithExtra(std::move(args), o.worker_flags),
                             progress);
    if (!addr.ok()) return addr.status();
    stack->workers_.push_back({id, *addr});
  }

  std::vector<std::string> worker_addresses;
  for (const StackMember& w : stack->workers_) worker_addresses.push_back(w.address);
  // --resume_mid_stream is the gateway's default; said here because supervision relies on it: a
  // stream on a worker that dies continues on another one.
  std::vector<std::string> gateway_args = {"--host=" + o.host,
                                           absl::StrCat("--port=", o.port),
                                           "--registry=" + stack->registry_.address,
                                           "--workers=" + absl::StrJoin(worker_addresses, ","),
                                           "--model_dir=" + o.model_dir,
                                           "--drain_timeout=5s",
                                           "--resume_mid_stream=true"};
  if (o.http_port >= 0) gateway_args.push_back(absl::StrCat("--http_port=", o.http_port));
  for (std::string& f : auth_flags("gateway", false)) gateway_args.push_back(std::move(f));
  addr = stack->StartChild("cascade-gateway", "gateway",
                           WithExtra(std::move(gateway_args), o.gateway_flags), progress,
                           {kHttpMarker});
  if (!addr.ok()) return addr.status();
  stack->gateway_ = {"cascade-gateway", *addr};
  // The HTTP front's real port ("HOST:PORT/v1" after the marker), pinned like --port for restarts.
  if (std::optional<std::string> http = stack->slots_.back().child->Noted(kHttpMarker)) {
    stack->http_port_ = PortOf(http->substr(0, http->find('/')));
    if (stack->http_port_ > 0)
      PinPort(stack->slots_.back().spec.args, stack->http_port_, "--http_port");
  }
  return stack;
}

absl::StatusOr<std::string> LocalStack::StartChild(const std::string& binary,
                                                   const std::string& log_name,
                                                   std::vector<std::string> args,
                                                   std::ostream* progress,
                                                   std::vector<std::string> note_markers) {
  ChildSpec spec{binary,
                 (fs::path(options_.bin_dir) / binary).string(),
                 std::move(args),
                 (fs::path(log_dir_) / (log_name + ".log")).string(),
                 "",
                 std::move(note_markers)};
  if (progress) *progress << "starting " << log_name << " (" << binary << ") ..." << std::flush;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(spec);
  if (!child.ok()) {
    if (progress) *progress << " failed" << std::endl;
    Stop(progress);
    return child.status();
  }
  const pid_t pid = (*child)->pid();
  slots_.push_back(
      Slot{spec, std::move(*child), ChildState{log_name}, RestartPolicy(options_.restart), start});
  slots_.back().state.pid = pid;
  absl::StatusOr<std::string> printed = slots_.back().child->WaitReady(options_.ready_timeout);
  if (!printed.ok()) {
    if (progress) *progress << " failed" << std::endl;
    Stop(progress);
    return printed.status();
  }
  std::string address = DialAddress(*printed);
  // A restart listens where the others already dial.
  PinPort(slots_.back().spec.args, PortOf(address));
  slots_.back().policy.OnReady(absl::Now());
  if (progress) {
    *progress << absl::StrFormat(" %s (pid %d, %.1f s)", address, pid,
                                 absl::ToDoubleSeconds(absl::Now() - start))
              << std::endl;
  }
  return address;
}

void LocalStack::Stop(std::ostream* progress) {
  if (slots_.empty()) return;
  if (progress) *progress << "stopping:";
  for (auto it = slots_.rbegin(); it != slots_.rend(); ++it) {
    std::string how = it->child->Stop(options_.stop_grace);
    if (it->state.phase == ChildState::Phase::kGaveUp) how = "given up on earlier";
    if (progress) *progress << " " << it->state.role << " " << how << ";" << std::flush;
  }
  if (progress) *progress << std::endl;
  slots_.clear();
}

std::optional<std::string> LocalStack::FindDeadChild() {
  for (Slot& s : slots_) {
    ChildProcess& c = *s.child;
    if (!c.Running()) {
      return absl::StrCat(c.name(), " (pid ", c.pid(), ") ", c.ExitDescription(), ". Its log (",
                          c.log_path(), ") ends with:\n", c.LogTail());
    }
  }
  return std::nullopt;
}

void LocalStack::Supervise(std::ostream* log) {
  const absl::Time now = absl::Now();
  for (Slot& s : slots_) SuperviseSlot(s, now, log);
}

void LocalStack::SuperviseSlot(Slot& s, absl::Time now, std::ostream* log) {
  switch (s.state.phase) {
    case ChildState::Phase::kServing:
      if (!s.child->Running()) OnSlotDeath(s, now, s.child->ExitDescription(), log);
      return;
    case ChildState::Phase::kStarting:
      if (std::optional<std::string> printed = s.child->ReadyAddress()) {
        s.state.phase = ChildState::Phase::kServing;
        s.policy.OnReady(now);
        if (log) {
          *log << "cascade up: " << s.state.role << " is back (pid " << s.state.pid << ", "
               << DialAddress(*printed) << ", ready in " << Seconds(now - s.since) << ")"
               << std::endl;
        }
        return;
      }
      if (!s.child->Running()) {
        OnSlotDeath(s, now, s.child->ExitDescription() + " before it was ready", log);
      } else if (now - s.since > options_.ready_timeout) {
        const std::string how = s.child->Stop(absl::Seconds(2));
        OnSlotDeath(
            s, now,
            absl::StrCat("printed no ready line within ",
                         absl::FormatDuration(options_.ready_timeout), " (stopped: ", how, ")"),
            log);
      }
      return;
    case ChildState::Phase::kWaitingToRestart: {
      if (now < s.since) return;
      ++s.state.restarts;
      absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(s.spec);
      if (!child.ok()) {
        OnSlotDeath(s, now, absl::StrCat("could not be restarted: ", child.status().message()),
                    log);
        return;
      }
      s.child = std::move(*child);  // the old process was reaped already
      s.state.pid = s.child->pid();
      s.state.phase = ChildState::Phase::kStarting;
      s.since = now;
      if (log) {
        *log << "cascade up: restarting " << s.state.role << " (restart " << s.state.restarts
             << ", pid " << s.state.pid << ")" << std::endl;
      }
      return;
    }
    case ChildState::Phase::kGaveUp:
      return;
  }
}

void LocalStack::OnSlotDeath(Slot& s, absl::Time now, const std::string& how, std::ostream* log) {
  const absl::Time restart_at = s.policy.OnDeath(now);
  // A crash says why in its log; a kill by signal (SIGKILL from outside, the OOM killer) does not.
  const bool crashed = how.rfind("killed by signal", 0) != 0;
  const std::string tail =
      crashed ? absl::StrCat(" Its log (", s.spec.log_path, ") ends with:\n", s.child->LogTail(8))
              : "\n";
  if (restart_at == absl::InfiniteFuture()) {
    s.state.phase = ChildState::Phase::kGaveUp;
    if (log) {
      *log << "cascade up: " << s.state.role << " (pid " << s.state.pid << ") " << how
           << ". Giving up on " << s.state.role << ": it died " << s.policy.quick_deaths()
           << " times in a row, each within "
           << absl::FormatDuration(s.policy.options().stable_after)
           << " of starting (--max_restarts=" << s.policy.options().max_restarts
           << "); the rest keep serving." << tail << std::flush;
    }
    return;
  }
  s.state.phase = ChildState::Phase::kWaitingToRestart;
  s.since = restart_at;
  if (log) {
    *log << "cascade up: " << s.state.role << " (pid " << s.state.pid << ") " << how
         << "; restarting it in " << Seconds(restart_at - now)
         << " (quick deaths in a row: " << s.policy.quick_deaths() << " of at most "
         << s.policy.options().max_restarts << ")." << tail << std::flush;
  }
}

std::vector<ChildState> LocalStack::States() const {
  std::vector<ChildState> out;
  for (const Slot& s : slots_) out.push_back(s.state);
  return out;
}

bool LocalStack::CanServe() const {
  bool gateway = false, worker = false;
  for (const Slot& s : slots_) {
    const bool alive = s.state.phase != ChildState::Phase::kGaveUp;
    if (s.spec.name == "cascade-gateway") gateway = alive;
    if (s.spec.name == "cascade-worker") worker |= alive;
  }
  return gateway && worker;
}

common::ClientTlsOptions LocalStack::AdminTls(std::string_view server_name) const {
  if (!certs_) return {};
  common::InternalAuthOptions admin{.ca_file = certs_->ca(),
                                    .cert_file = certs_->cert("admin"),
                                    .key_file = certs_->key("admin")};
  return common::InternalClientTls(admin, server_name);
}

bool LocalStack::RemoveOwnLogDir() {
  if (!own_log_dir_) return false;
  std::error_code ec;
  fs::remove_all(log_dir_, ec);
  own_log_dir_ = false;
  return !ec;
}

LocalStack::~LocalStack() { Stop(nullptr); }

}  // namespace cascade::cli
