// Starting and stopping a local registry + workers + gateway as child processes.
#include "services/cli/local_stack.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <ostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gpu_worker/model/generator.h"

namespace cascade::cli {
namespace fs = std::filesystem;

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
  model::MkmodelOptions mk;
  mk.preset = preset;
  mk.out_dir = dir;
  if (absl::Status s = model::RunMkmodel(mk); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("generating the model in ", dir, ": ", s.message()));
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
  } else {
    std::error_code ec;
    fs::create_directories(o.log_dir, ec);
    if (ec)
      return absl::InternalError(absl::StrCat("cannot create ", o.log_dir, ": ", ec.message()));
  }
  stack->log_dir_ = o.log_dir;
  if (progress) *progress << "logs: " << o.log_dir << "/*.log" << std::endl;

  // Registry first: the workers and the gateway need its real port.
  absl::StatusOr<std::string> addr = stack->StartChild(
      "cascade-registry", "registry",
      {"--host=127.0.0.1", absl::StrCat("--port=", o.registry_port), "--drain_timeout=3s"},
      progress);
  if (!addr.ok()) return addr.status();
  stack->registry_ = {"cascade-registry", *addr};

  int threads = o.worker_threads;
  if (threads <= 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / o.workers);
  }
  for (int i = 0; i < o.workers; ++i) {
    std::string id = absl::StrCat("worker-", i);
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
    addr = stack->StartChild("cascade-worker", id, std::move(args), progress);
    if (!addr.ok()) return addr.status();
    stack->workers_.push_back({id, *addr});
  }

  std::vector<std::string> worker_addresses;
  for (const StackMember& w : stack->workers_) worker_addresses.push_back(w.address);
  addr = stack->StartChild("cascade-gateway", "gateway",
                           {"--host=" + o.host, absl::StrCat("--port=", o.port),
                            "--registry=" + stack->registry_.address,
                            "--workers=" + absl::StrJoin(worker_addresses, ","),
                            "--model_dir=" + o.model_dir, "--drain_timeout=5s"},
                           progress);
  if (!addr.ok()) return addr.status();
  stack->gateway_ = {"cascade-gateway", *addr};
  return stack;
}

absl::StatusOr<std::string> LocalStack::StartChild(const std::string& binary,
                                                   const std::string& log_name,
                                                   std::vector<std::string> args,
                                                   std::ostream* progress) {
  ChildSpec spec{binary, (fs::path(options_.bin_dir) / binary).string(), std::move(args),
                 (fs::path(log_dir_) / (log_name + ".log")).string()};
  if (progress) *progress << "starting " << log_name << " (" << binary << ") ..." << std::flush;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(spec);
  if (!child.ok()) {
    if (progress) *progress << " failed" << std::endl;
    Stop(progress);
    return child.status();
  }
  children_.push_back(std::move(*child));
  absl::StatusOr<std::string> printed = children_.back()->WaitReady(options_.ready_timeout);
  if (!printed.ok()) {
    if (progress) *progress << " failed" << std::endl;
    Stop(progress);
    return printed.status();
  }
  std::string address = DialAddress(*printed);
  if (progress) {
    *progress << absl::StrFormat(" %s (pid %d, %.1f s)", address, children_.back()->pid(),
                                 absl::ToDoubleSeconds(absl::Now() - start))
              << std::endl;
  }
  return address;
}

void LocalStack::Stop(std::ostream* progress) {
  if (children_.empty()) return;
  if (progress) *progress << "stopping:";
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    std::string how = (*it)->Stop(options_.stop_grace);
    if (progress) {
      *progress << " " << fs::path((*it)->log_path()).stem().string() << " " << how << ";"
                << std::flush;
    }
  }
  if (progress) *progress << std::endl;
  children_.clear();
}

std::optional<std::string> LocalStack::FindDeadChild() {
  for (const std::unique_ptr<ChildProcess>& c : children_) {
    if (!c->Running()) {
      return absl::StrCat(c->name(), " (pid ", c->pid(), ") ", c->ExitDescription(), ". Its log (",
                          c->log_path(), ") ends with:\n", c->LogTail());
    }
  }
  return std::nullopt;
}

LocalStack::~LocalStack() { Stop(nullptr); }

}  // namespace cascade::cli
