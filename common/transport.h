// Transport settings shared by Cascade's servers and their clients: keepalive, message sizes,
// connection age, TLS. Servers and clients must agree on keepalive (a client that pings more
// often than the server permits gets GOAWAY "too_many_pings"), so both sides derive their
// settings from the same structs here.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cascade::common {

inline constexpr int64_t kDefaultMaxMessageBytes = 64 << 20;

struct KeepaliveOptions {
  // Interval between pings on an idle connection, and how long to wait for the ack before the
  // connection is considered dead. Detects peers that vanished without a FIN (node loss).
  absl::Duration time = absl::Seconds(30);
  absl::Duration timeout = absl::Seconds(10);
  // Ping even with no RPC in flight, so idle connections to workers stay known-good.
  bool permit_without_calls = true;
  // Server side: the shortest ping interval a client may use. Clients built with
  // ChannelArgumentsForClients() never ping more often than this.
  absl::Duration min_ping_interval = absl::Seconds(10);
};

// Server TLS. Empty cert_file means plaintext. With client_ca_file, clients must present a
// certificate signed by that CA (mutual TLS).
struct ServerTlsOptions {
  std::string cert_file;  // PEM certificate chain
  std::string key_file;   // PEM private key
  std::string client_ca_file;
  bool enabled() const { return !cert_file.empty(); }
};

// Client TLS. enabled == false means plaintext.
struct ClientTlsOptions {
  bool enabled = false;
  std::string ca_file;    // PEM roots to verify the server; empty = the system's roots
  std::string cert_file;  // PEM client certificate for mutual TLS (with key_file)
  std::string key_file;
  // Expected name in the server's certificate when it differs from the address' host.
  std::string target_name_override;
};

struct ClientChannelOptions {
  KeepaliveOptions keepalive;
  int64_t max_message_bytes = kDefaultMaxMessageBytes;
  ClientTlsOptions tls;
};

// Reads the files and builds credentials. Errors name the file that could not be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& tls);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsOptions& tls);

// Channel arguments matching a Cascade server: keepalive no more often than the server permits,
// no cap on pings without data, message size limits, and the TLS name override if set.
grpc::ChannelArguments ChannelArgumentsForClients(const ClientChannelOptions& options = {});

// A channel to `address` ("host:port", or any gRPC target) with the arguments above.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& address, const ClientChannelOptions& options = {});
// Same, with default transport settings and the given TLS.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ClientTlsOptions& tls);

// Reads a whole file; used for PEM files. NotFound/PermissionDenied-style errors name the path.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace cascade::common
