// Authentication and roles for Cascade's internal RPCs (ChunkRegistry, Worker): mutual TLS with
// a cluster CA, where each client certificate's URI SAN names who it is:
//   cascade://gateway, cascade://admin, cascade://registry, cascade://worker/<worker id>.
// A server checks every call before its handler runs (an AuthMetadataProcessor): the client
// certificate must chain to the cluster CA (UNAUTHENTICATED otherwise, also without one) and its
// role must be allowed for the method (PERMISSION_DENIED otherwise). Handlers that act for a
// worker id also check the id against the caller's (CheckWorkerIdentity). Internal servers also
// prove who they are: the registry's certificate carries the DNS name registry.cascade.internal,
// a worker's worker.cascade.internal, and clients accept only those names from the cluster CA.
// `--insecure_internal` turns all of it off: plaintext, no identities, no roles.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/flags.h"
#include "common/transport.h"

namespace cascade::common {

enum class Role { kGateway, kWorker, kAdmin, kRegistry };
std::string_view RoleName(Role role);  // "gateway", "worker", "admin", "registry"

inline constexpr char kRegistryServerName[] = "registry.cascade.internal";
inline constexpr char kWorkerServerName[] = "worker.cascade.internal";

struct PeerIdentity {
  Role role = Role::kGateway;
  std::string worker_id;         // kWorker only
  std::string ToString() const;  // the URI, e.g. cascade://worker/w0
};

// "cascade://gateway", "cascade://worker/<id>", ...; worker_id is used for kWorker only.
std::string IdentityUri(Role role, std::string_view worker_id = "");
// The inverse; InvalidArgument for anything else.
absl::StatusOr<PeerIdentity> ParseIdentityUri(std::string_view uri);

// The identity in a PEM certificate's URI SANs (the first cascade:// one), without verifying
// the certificate; for a process reading its own certificate (a worker learning its id).
absl::StatusOr<PeerIdentity> IdentityOfCertificate(std::string_view cert_pem);

// What --internal_ca/--internal_cert/--internal_key/--insecure_internal set.
struct InternalAuthOptions {
  bool insecure = false;
  std::string ca_file;    // PEM cluster CA bundle (several CAs while rotating)
  std::string cert_file;  // this process' certificate (its identity)
  std::string key_file;
};

// Registers the four flags. `who` says in the help what the certificate is for.
void RegisterInternalAuthFlags(FlagSet* flags, InternalAuthOptions* options);
// OK when insecure, or when all three files are given; otherwise InvalidArgument saying what is
// missing and how to opt out.
absl::Status ValidateInternalAuth(const InternalAuthOptions& options);

// ValidateInternalAuth, then (unless insecure) reads --internal_cert and checks it names `role`,
// so a process started with another role's certificate stops at once with the reason.
absl::StatusOr<PeerIdentity> CheckOwnIdentity(const InternalAuthOptions& options, Role role);

// Client TLS for dialing an internal server whose certificate carries `server_name`
// (kRegistryServerName or kWorkerServerName), presenting this process' certificate; plaintext
// when insecure. REQUIRES: ValidateInternalAuth(options).ok().
ClientTlsOptions InternalClientTls(const InternalAuthOptions& options,
                                   std::string_view server_name);

// Method policy: full method name ("/cascade.v2.ChunkRegistryService/Resolve") -> roles allowed.
// Methods of grpc.health.v1.Health and server reflection are open to every role; a method not
// listed is refused to all (PERMISSION_DENIED).
using MethodPolicy = std::map<std::string, std::set<Role>, std::less<>>;

// The server side: certificate, key and CA files, plus the policy.
struct InternalServerAuth {
  InternalAuthOptions files;
  MethodPolicy policy;
};

// Server credentials that request a client certificate and run the checks above on every call.
// Errors name a file that cannot be read or does not parse.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeInternalServerCredentials(
    const InternalServerAuth& auth);

// The caller's identity on a server with internal auth, from its (already verified) client
// certificate; nullopt when the call is not authenticated by certificate (an insecure server).
std::optional<PeerIdentity> CallerIdentity(const grpc::ServerContextBase& context);

// For handlers acting for a worker id: OK on an insecure server, for an admin, or for the worker
// with that id; PERMISSION_DENIED otherwise ("worker 'w1' may not act for worker 'w2'").
grpc::Status CheckWorkerIdentity(const grpc::ServerContextBase& context,
                                 std::string_view worker_id);

}  // namespace cascade::common
