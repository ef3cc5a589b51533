// Internal auth's pieces without a server: identities, flag validation, and the certificates
// cert_gen writes, checked by the openssl command-line tool as an outside oracle (chain, purpose,
// SANs, key file modes). The servers' enforcement is tested over loopback in
// tests/integration/internal_auth_test.cc.
#include "common/internal_auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "common/cert_gen.h"
#include "common/transport.h"
#include "tests/common/scratch_dir.h"

namespace cascade::common {
namespace {

using ::testing::HasSubstr;

// Runs a shell command; returns its exit code and stdout+stderr in *out.
int RunShell(const std::string& cmd, std::string* out) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out->append(buf, n);
  int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class CertsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test_support::ScratchDir("cascade_internal_auth_test");
    auto paths = WriteStackCerts(dir_->path(), {.worker_ids = {"w0", "cascade-worker-1"}});
    ASSERT_TRUE(paths.ok()) << paths.status();
  }
  static void TearDownTestSuite() { delete dir_; }
  static StackCertPaths Paths() { return StackCertPaths{dir_->path()}; }
  static test_support::ScratchDir* dir_;
};
test_support::ScratchDir* CertsTest::dir_ = nullptr;

TEST_F(CertsTest, OpensslVerifiesEachCertificateAgainstTheCaForItsPurpose) {
  StackCertPaths p = Paths();
  const std::string verify = "openssl verify -CAfile " + p.ca() + " -purpose ";
  for (const std::string& cert : {p.cert("gateway"), p.cert("admin"), p.cert("registry"),
                                  p.worker_cert("w0"), p.worker_cert("cascade-worker-1")}) {
    std::string out;
    EXPECT_EQ(RunShell(verify + "sslclient " + cert, &out), 0) << cert << ": " << out;
  }
  for (const std::string& cert : {p.cert("registry"), p.worker_cert("w0")}) {
    std::string out;
    EXPECT_EQ(RunShell(verify + "sslserver " + cert, &out), 0) << cert << ": " << out;
  }
  // Client-only roles cannot serve.
  std::string out;
  EXPECT_NE(RunShell(verify + "sslserver " + p.cert("admin"), &out), 0) << out;
}

TEST_F(CertsTest, CertificatesNameTheirRoleAndServersTheirDnsName) {
  StackCertPaths p = Paths();
  std::string out;
  ASSERT_EQ(RunShell("openssl x509 -noout -ext subjectAltName -in " + p.worker_cert("w0"), &out),
            0);
  EXPECT_THAT(out, HasSubstr("URI:cascade://worker/w0"));
  EXPECT_THAT(out, HasSubstr("DNS:worker.cascade.internal"));
  out.clear();
  ASSERT_EQ(RunShell("openssl x509 -noout -ext subjectAltName -in " + p.cert("registry"), &out), 0);
  EXPECT_THAT(out, HasSubstr("URI:cascade://registry"));
  EXPECT_THAT(out, HasSubstr("DNS:registry.cascade.internal"));
  for (auto [file, want] :
       {std::pair{p.cert("gateway"), "cascade://gateway"},
        std::pair{p.cert("admin"), "cascade://admin"},
        std::pair{p.worker_cert("cascade-worker-1"), "cascade://worker/cascade-worker-1"}}) {
    auto pem = ReadFileToString(file);
    ASSERT_TRUE(pem.ok());
    auto id = IdentityOfCertificate(*pem);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(id->ToString(), want);
  }
  auto ca = ReadFileToString(p.ca());
  ASSERT_TRUE(ca.ok());
  EXPECT_FALSE(IdentityOfCertificate(*ca).ok());  // the CA names no role
}

TEST_F(CertsTest, KeysAreReadableByTheOwnerOnly) {
  StackCertPaths p = Paths();
  for (const std::string& key : {p.key("gateway"), p.key("registry"), p.worker_key("w0")}) {
    struct stat st;
    ASSERT_EQ(stat(key.c_str(), &st), 0) << key;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << key;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_->path() + "/ca.key"));  // not written unless asked
}

TEST_F(CertsTest, CheckOwnIdentityRefusesAnotherRolesCertificate) {
  StackCertPaths p = Paths();
  InternalAuthOptions gateway{
      .ca_file = p.ca(), .cert_file = p.cert("gateway"), .key_file = p.key("gateway")};
  EXPECT_TRUE(CheckOwnIdentity(gateway, Role::kGateway).ok());
  absl::StatusOr<PeerIdentity> as_worker = CheckOwnIdentity(gateway, Role::kWorker);
  EXPECT_EQ(as_worker.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(as_worker.status().message(),
              HasSubstr("names cascade://gateway, not a worker certificate"));
}

TEST(InternalAuthTest, IdentityUrisRoundTripAndStrangersAreRefused) {
  for (const char* uri : {"cascade://gateway", "cascade://admin", "cascade://registry",
                          "cascade://worker/w0", "cascade://worker/cascade-worker-12"}) {
    auto id = ParseIdentityUri(uri);
    ASSERT_TRUE(id.ok()) << uri;
    EXPECT_EQ(id->ToString(), uri);
  }
  for (const char* uri : {"cascade://worker/", "cascade://worker/a/b", "cascade://root",
                          "spiffe://cluster/gateway", "cascade:/gateway", ""}) {
    EXPECT_EQ(ParseIdentityUri(uri).status().code(), absl::StatusCode::kInvalidArgument) << uri;
  }
}

TEST(InternalAuthTest, MissingFilesNameTheFlagsAndTheOptOut) {
  absl::Status s = ValidateInternalAuth({.cert_file = "c.pem"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("need --internal_ca, --internal_key"));
  EXPECT_THAT(s.message(), HasSubstr("--insecure_internal"));
  EXPECT_TRUE(ValidateInternalAuth({.insecure = true}).ok());
  EXPECT_EQ(ValidateInternalAuth({.insecure = true, .ca_file = "ca.pem"}).code(),
            absl::StatusCode::kInvalidArgument);
  // Insecure clients dial in plaintext; secure ones pin the server's role name.
  EXPECT_FALSE(InternalClientTls({.insecure = true}, kWorkerServerName).enabled);
  ClientTlsOptions tls =
      InternalClientTls({.ca_file = "ca", .cert_file = "c", .key_file = "k"}, kWorkerServerName);
  EXPECT_TRUE(tls.enabled);
  EXPECT_EQ(tls.target_name_override, "worker.cascade.internal");
}

TEST(InternalAuthTest, WorkerIdsThatCannotNameACertificateAreRefused) {
  for (const char* id : {"", "..", "a/b", "w 0", "w:0"}) {
    EXPECT_EQ(ValidateWorkerIdForCert(id).code(), absl::StatusCode::kInvalidArgument) << id;
  }
  EXPECT_TRUE(ValidateWorkerIdForCert("cascade-worker-0").ok());
  test_support::ScratchDir scratch("cascade_internal_auth_test");
  const std::string never = scratch.path() + "/never-written";
  auto r = WriteStackCerts(never, {.worker_ids = {"a/b"}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(never));
}

}  // namespace
}  // namespace cascade::common
