// TLS credentials and client channel settings: see transport.h.
#include "common/transport.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cascade::common {
namespace {

int ClampMs(absl::Duration d) {
  int64_t ms = absl::ToInt64Milliseconds(d);
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT32_MAX));
}

int ClampBytes(int64_t bytes) {
  // gRPC takes int; -1 would mean unlimited, which we never want by accident.
  return static_cast<int>(std::clamp<int64_t>(bytes, 0, INT32_MAX));
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& tls) {
  if (!tls.enabled()) {
    if (!tls.key_file.empty() || !tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls_key/--tls_client_ca given without --tls_cert");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.key_file.empty()) return absl::InvalidArgumentError("--tls_cert given without --tls_key");
  absl::StatusOr<std::string> cert = ReadFileToString(tls.cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFileToString(tls.key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFileToString(tls.client_ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsOptions& tls) {
  if (!tls.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  if (!tls.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFileToString(tls.ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError("a client certificate needs both cert_file and key_file");
  }
  if (!tls.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadFileToString(tls.cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFileToString(tls.key_file);
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  return grpc::SslCredentials(options);
}

grpc::ChannelArguments ChannelArgumentsForClients(const ClientChannelOptions& options) {
  grpc::ChannelArguments args;
  const KeepaliveOptions& ka = options.keepalive;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ClampMs(std::max(ka.time, ka.min_ping_interval)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ClampMs(ka.timeout));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, ka.permit_without_calls ? 1 : 0);
  // Keepalive pings must keep flowing on long idle streams (a Watch, a slow prefill).
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(ClampBytes(options.max_message_bytes));
  args.SetMaxSendMessageSize(ClampBytes(options.max_message_bytes));
  if (!options.tls.target_name_override.empty()) {
    args.SetSslTargetNameOverride(options.tls.target_name_override);
  }
  return args;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ClientChannelOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      MakeChannelCredentials(options.tls);
  if (!creds.ok()) return creds.status();
  return grpc::CreateCustomChannel(address, *creds, ChannelArgumentsForClients(options));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ClientTlsOptions& tls) {
  ClientChannelOptions options;
  options.tls = tls;
  return MakeChannel(address, options);
}

}  // namespace cascade::common
