// Certificates for Cascade's internal mTLS, made with OpenSSL: a cluster CA and, per role, a
// certificate whose URI SAN names the identity (internal_auth.h). `cascade up`, `cascade demo`,
// `cascade certs` (the Kubernetes Job) and the tests make theirs here, so all share one layout.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cascade::common {

// A PEM certificate and its PEM (PKCS#8) private key; keys are ECDSA P-256.
struct CertAndKey {
  std::string cert_pem;
  std::string key_pem;
};

// A self-signed CA certificate (basicConstraints CA:TRUE, keyCertSign), valid from an hour ago
// (clock skew) for `validity`.
absl::StatusOr<CertAndKey> NewCertAuthority(std::string_view common_name, absl::Duration validity);

struct CertRequest {
  std::string common_name;
  std::vector<std::string> uris;       // URI SANs, e.g. cascade://worker/w0
  std::vector<std::string> dns_names;  // DNS SANs, e.g. worker.cascade.internal
  bool server = false;                 // extendedKeyUsage serverAuth (clientAuth always)
  absl::Duration validity = absl::Hours(24 * 365);
};

// A leaf certificate signed by `ca`. Errors: a CA that does not parse, or OpenSSL failing.
absl::StatusOr<CertAndKey> IssueCert(const CertAndKey& ca, const CertRequest& request);

// The files of one stack's internal credentials in `dir` (see WriteStackCerts).
struct StackCertPaths {
  std::string dir;
  std::string ca() const { return dir + "/ca.crt"; }
  // role is "registry", "gateway" or "admin".
  std::string cert(std::string_view role) const;
  std::string key(std::string_view role) const;
  std::string worker_cert(std::string_view worker_id) const;  // dir/worker.<id>.crt
  std::string worker_key(std::string_view worker_id) const;
};

struct StackCertOptions {
  std::vector<std::string> worker_ids;
  absl::Duration validity = absl::Hours(24 * 365);
  bool write_ca_key = false;  // ca.key, to issue more later (`cascade certs --ca_key`)
};

// Makes a fresh CA and writes ca.crt, registry.{crt,key} (server + client), gateway.{crt,key}
// and admin.{crt,key} (clients), and worker.<id>.{crt,key} (server + client) per worker id into
// `dir` (created, 0700; keys 0600). Worker ids must be 1..128 of [A-Za-z0-9._-]
// (InvalidArgument naming the bad one).
absl::StatusOr<StackCertPaths> WriteStackCerts(const std::string& dir,
                                               const StackCertOptions& options);

// Issues one more worker certificate into `dir` with the CA in dir/ca.crt and `ca_key_file`.
absl::Status WriteWorkerCert(const std::string& dir, const std::string& ca_key_file,
                             const std::string& worker_id, absl::Duration validity);

// Writes a new random bearer token (32 bytes from OpenSSL's RAND_bytes, as 64 hex digits) to
// `path`, mode 0600: the gateway's --auth_token_file.
absl::Status WriteRandomToken(const std::string& path);

// Checks a worker id can name a certificate and a file: 1..128 of [A-Za-z0-9._-].
absl::Status ValidateWorkerIdForCert(std::string_view worker_id);

}  // namespace cascade::common
