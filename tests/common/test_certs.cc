// Test certificates: see test_certs.h.
#include "tests/common/test_certs.h"

#include <cstdio>
#include <cstdlib>

#include "tests/common/scratch_dir.h"

namespace cascade::common::testing {
namespace {

std::vector<std::string> DefaultWorkerIds() {
  // Ids the registry tests use besides the numbered ones.
  std::vector<std::string> ids = {"w", "good", "nobody"};
  for (int i = 0; i < 8; ++i) {
    ids.push_back("w" + std::to_string(i));
    ids.push_back("worker-" + std::to_string(i));
  }
  return ids;
}

// <scratch>/<name>: one scratch directory per test binary, removed when it exits (the servers a
// test starts read the files whenever they start).
std::string TempDir(const std::string& name) {
  static const test_support::ScratchDir scratch("cascade-certs");
  return scratch.path() + "/" + name;
}

}  // namespace

TestCerts::TestCerts(const std::string& dir, const std::vector<std::string>& worker_ids) {
  absl::StatusOr<StackCertPaths> paths = WriteStackCerts(dir, {.worker_ids = worker_ids});
  if (!paths.ok()) {
    std::fprintf(stderr, "cannot make test certificates in %s: %s\n", dir.c_str(),
                 paths.status().ToString().c_str());
    std::abort();
  }
  paths_ = *paths;
}

const TestCerts& TestCerts::Default() {
  static const TestCerts* certs = new TestCerts(TempDir("default"), DefaultWorkerIds());
  return *certs;
}

const TestCerts& TestCerts::OtherCa() {
  static const TestCerts* certs = new TestCerts(TempDir("other-ca"), DefaultWorkerIds());
  return *certs;
}

InternalAuthOptions TestCerts::For(Role role, std::string_view worker_id) const {
  InternalAuthOptions o;
  o.ca_file = paths_.ca();
  if (role == Role::kWorker) {
    o.cert_file = paths_.worker_cert(worker_id);
    o.key_file = paths_.worker_key(worker_id);
  } else {
    o.cert_file = paths_.cert(RoleName(role));
    o.key_file = paths_.key(RoleName(role));
  }
  return o;
}

ClientTlsOptions TestCerts::Client(Role role, std::string_view server_name,
                                   std::string_view worker_id) const {
  return InternalClientTls(For(role, worker_id), server_name);
}

}  // namespace cascade::common::testing
