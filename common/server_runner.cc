// The server runner: see server_runner.h.
#include "common/server_runner.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include <iostream>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/shutdown_signals.h"

namespace cascade::common {
namespace {

// IPv6 literals need brackets in a gRPC address.
std::string JoinHostPort(const std::string& host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

int ToMs(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 0, INT32_MAX));
}

bool Enabled(absl::Duration d) { return d > absl::ZeroDuration() && d != absl::InfiniteDuration(); }

absl::Status Validate(const ServerOptions& o) {
  if (o.port < 0 || o.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port must be 0..65535, got ", o.port));
  }
  if (o.metrics_port < -1 || o.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port must be -1 (off) or 0..65535, got ", o.metrics_port));
  }
  if (o.max_message_bytes <= 0) {
    return absl::InvalidArgumentError("--max_message_bytes must be positive");
  }
  if (o.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_timeout must not be negative");
  }
  return absl::OkStatus();
}

}  // namespace

ServerRunner::ServerRunner(ServerOptions options) : options_(std::move(options)) {}

ServerRunner::~ServerRunner() { Shutdown(options_.drain_timeout); }

void ServerRunner::AddService(ServiceRegistration registration) {
  services_.push_back(std::move(registration));
}

void ServerRunner::AddDrainCallback(std::function<void()> callback) {
  drain_callbacks_.push_back([callback = std::move(callback)](absl::Time) { callback(); });
}

void ServerRunner::AddDrainCallback(std::function<void(absl::Time deadline)> callback) {
  drain_callbacks_.push_back(std::move(callback));
}

std::string ServerRunner::address() const { return JoinHostPort(options_.host, port_); }

std::string ServerRunner::local_address() const {
  return JoinHostPort(IsWildcard(options_.host) ? "127.0.0.1" : options_.host, port_);
}

absl::Status ServerRunner::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kNew) return absl::FailedPreconditionError("Start() called twice");
  }
  if (absl::Status s = Validate(options_); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds;
  if (options_.internal_auth.has_value()) {
    if (options_.tls.enabled() || !options_.tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(options_.name,
                       ": --tls_cert/--tls_client_ca cannot be combined with internal auth "
                       "(--internal_cert already serves mutual TLS); they apply only with "
                       "--insecure_internal"));
    }
    creds = MakeInternalServerCredentials(*options_.internal_auth);
  } else {
    creds = MakeServerCredentials(options_.tls);
  }
  if (!creds.ok()) return creds.status();

  // The plugin is picked up by every ServerBuilder created after this call.
  static std::once_flag reflection_once;
  std::call_once(reflection_once,
                 [] { grpc::reflection::InitProtoReflectionServerBuilderPlugin(); });

  std::string listen_address = JoinHostPort(options_.host, options_.port);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen_address, *creds, &port_);
  builder.RegisterService(&health_);
  for (const ServiceRegistration& r : services_) builder.RegisterService(r.service);
  int max_bytes = static_cast<int>(std::min<int64_t>(options_.max_message_bytes, INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_bytes);
  builder.SetMaxSendMessageSize(max_bytes);
  // gRPC sets SO_REUSEPORT by default, which lets a second server bind a port already in use
  // and silently share its traffic; a busy port must be an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const KeepaliveOptions& ka = options_.keepalive;
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ToMs(ka.time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ToMs(ka.timeout));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
                             ka.permit_without_calls ? 1 : 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             ToMs(ka.min_ping_interval));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  if (Enabled(options_.max_connection_age)) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, ToMs(options_.max_connection_age));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               ToMs(options_.max_connection_age_grace));
  }
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat(options_.name, ": cannot listen on ", listen_address,
                     " (the port is in use, or the address is not valid on this machine)"));
  }

  if (options_.metrics_port >= 0) {
    MetricsRegistry* registry =
        options_.metrics != nullptr ? options_.metrics : &MetricsRegistry::Default();
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http = MetricsHttpServer::Start(
        options_.host, options_.metrics_port, registry, [this] { return health_.IsServing(""); });
    if (!http.ok()) {
      server_->Shutdown(std::chrono::system_clock::now());
      server_->Wait();
      server_.reset();
      return absl::Status(http.status().code(),
                          absl::StrCat(options_.name, ": ", http.status().message()));
    }
    metrics_http_ = *std::move(http);
    metrics_port_ = metrics_http_->port();
  }

  for (const ServiceRegistration& r : services_) health_.SetServingStatus(r.name, true);
  health_.SetServingStatus("", true);
  {
    absl::MutexLock lock(&mu_);
    state_ = State::kRunning;
  }
  if (options_.handle_signals) {
    signal_callback_id_ = internal::AddShutdownCallback([this] { RequestShutdown(); });
  }
  LogInfo("server_started",
          {{"server", options_.name},
           {"address", address()},
           {"metrics_port", metrics_port_},
           {"tls", options_.tls.enabled() || options_.internal_auth.has_value()},
           {"mtls", !options_.tls.client_ca_file.empty() || options_.internal_auth.has_value()},
           {"internal_auth", options_.internal_auth.has_value()}});
  if (options_.print_ready_line) {
    // Scripts and tests wait for exactly this line.
    std::cout << options_.name << " serving on " << address() << std::endl;
  }
  return absl::OkStatus();
}

void ServerRunner::RequestShutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_requested_ = true;
}

bool ServerRunner::shutdown_requested() const {
  absl::MutexLock lock(&mu_);
  return shutdown_requested_;
}

void ServerRunner::Wait() {
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutdown_requested_ || state_ == State::kStopped || state_ == State::kNew;
    };
    mu_.Await(absl::Condition(&ready));
  }
  Shutdown(options_.drain_timeout);
}

void ServerRunner::Shutdown(absl::Duration drain) {
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kNew || state_ == State::kStopped) return;
    if (state_ == State::kShuttingDown) {
      auto stopped = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return state_ == State::kStopped; };
      mu_.Await(absl::Condition(&stopped));
      return;
    }
    state_ = State::kShuttingDown;
    shutdown_requested_ = true;
  }
  absl::Time start = absl::Now();
  const absl::Time deadline = start + drain;
  LogInfo("server_draining", {{"server", options_.name}, {"drain_timeout", drain}});
  // Load balancers and health-checking clients stop sending here first.
  health_.SetAllNotServing();
  for (auto& callback : drain_callbacks_) callback(deadline);
  // Watch streams never end on their own; ending them now keeps them from holding the drain.
  health_.Shutdown();
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
  bool forced = absl::Now() >= deadline;
  if (metrics_http_ != nullptr) metrics_http_->Stop();
  if (signal_callback_id_ != 0) {
    internal::RemoveShutdownCallback(signal_callback_id_);
    signal_callback_id_ = 0;
  }
  LogInfo("server_stopped", {{"server", options_.name},
                             {"drain_seconds", absl::ToDoubleSeconds(absl::Now() - start)},
                             {"deadline_reached", forced}});
  absl::MutexLock lock(&mu_);
  state_ = State::kStopped;
}

absl::Status RunServer(const ServerOptions& options,
                       const std::vector<ServiceRegistration>& services,
                       const std::function<absl::Status(ServerRunner&)>& on_started) {
  SetLogLevel(options.log_level);
  SetLogFormat(options.log_format);
  ServerRunner runner(options);
  for (const ServiceRegistration& r : services) runner.AddService(r);
  if (absl::Status s = runner.Start(); !s.ok()) return s;
  if (on_started) {
    if (absl::Status s = on_started(runner); !s.ok()) {
      runner.Shutdown(options.drain_timeout);
      return s;
    }
  }
  runner.Wait();
  return absl::OkStatus();
}

}  // namespace cascade::common
