// A throwaway cluster CA and per-role certificates for tests that start Cascade components by
// hand (in-process servers, or binaries as children), so they run with internal auth on like
// `cascade up` does. Made once per test process with the same code as `cascade certs`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/cert_gen.h"
#include "common/internal_auth.h"

namespace cascade::common::testing {

class TestCerts {
 public:
  // The process-wide set: a CA, registry/gateway/admin certificates, and worker certificates
  // for the ids w0..w7, worker-0..worker-7, w, good and nobody (the ids the tests and
  // `cascade up` use).
  static const TestCerts& Default();
  // Another, unrelated CA with the same layout: its certificates must be refused.
  static const TestCerts& OtherCa();
  // A fresh set in `dir` for `worker_ids`; aborts the test binary if OpenSSL fails.
  TestCerts(const std::string& dir, const std::vector<std::string>& worker_ids);

  const StackCertPaths& paths() const { return paths_; }
  // --internal_* for a process of `role` (`worker_id` for Role::kWorker).
  InternalAuthOptions For(Role role, std::string_view worker_id = "") const;
  // Client TLS presenting `role`'s certificate to a server named `server_name`
  // (kRegistryServerName or kWorkerServerName).
  ClientTlsOptions Client(Role role, std::string_view server_name,
                          std::string_view worker_id = "") const;

 private:
  StackCertPaths paths_;
};

}  // namespace cascade::common::testing
