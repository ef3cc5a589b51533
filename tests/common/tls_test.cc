// TLS and mutual TLS with a self-signed certificate made at test time by the openssl CLI: a
// client that trusts it gets through, a plaintext client does not, and under mTLS a client
// without a certificate is refused. Skipped, with a message, where openssl is missing.
#include <cstdlib>
#include <string>

#include "common/server_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/scratch_dir.h"
#include "tests/common/test_util.h"

namespace cascade::common {
namespace {

using grpc::health::v1::HealthCheckResponse;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test_support::ScratchDir("cascade_tls_test");
    // EC keys keep generation fast; SANs so that "localhost" and 127.0.0.1 both verify.
    std::string cmd =
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
        "-nodes -days 1 -subj /CN=localhost "
        "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 "
        "-keyout " +
        Path("key.pem") + " -out " + Path("cert.pem") + " >/dev/null 2>&1";
    have_cert_ = std::system(cmd.c_str()) == 0;
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override {
    if (!have_cert_) GTEST_SKIP() << "openssl could not make a test certificate; skipping TLS";
  }
  static std::string Path(const std::string& name) { return dir_->path() + "/" + name; }

  std::unique_ptr<ServerRunner> StartServer(bool mutual) {
    ServerOptions o;
    o.host = "127.0.0.1";
    o.handle_signals = false;
    o.tls.cert_file = Path("cert.pem");
    o.tls.key_file = Path("key.pem");
    if (mutual) o.tls.client_ca_file = Path("cert.pem");  // the self-signed cert is its own CA
    auto runner = std::make_unique<ServerRunner>(o);
    EXPECT_TRUE(runner->Start().ok());
    return runner;
  }

  grpc::Status Check(const ServerRunner& runner, const ClientTlsOptions& tls) {
    auto channel = MakeChannel("localhost:" + std::to_string(runner.port()), tls);
    EXPECT_TRUE(channel.ok()) << channel.status();
    HealthCheckResponse::ServingStatus s;
    return testing::CheckHealth(*channel, "", &s, absl::Seconds(3));
  }

  static test_support::ScratchDir* dir_;
  static bool have_cert_;
};
test_support::ScratchDir* TlsTest::dir_ = nullptr;
bool TlsTest::have_cert_ = false;

TEST_F(TlsTest, TrustingClientConnectsAndPlaintextClientFails) {
  auto runner = StartServer(/*mutual=*/false);
  ClientTlsOptions tls{.enabled = true, .ca_file = Path("cert.pem")};
  grpc::Status ok = Check(*runner, tls);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_FALSE(Check(*runner, ClientTlsOptions{}).ok());
}

TEST_F(TlsTest, MutualTlsRequiresAClientCertificate) {
  auto runner = StartServer(/*mutual=*/true);
  ClientTlsOptions no_cert{.enabled = true, .ca_file = Path("cert.pem")};
  EXPECT_FALSE(Check(*runner, no_cert).ok());
  ClientTlsOptions with_cert = no_cert;
  with_cert.cert_file = Path("cert.pem");
  with_cert.key_file = Path("key.pem");
  grpc::Status ok = Check(*runner, with_cert);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

TEST_F(TlsTest, MissingClientFilesAreClearErrors) {
  ClientTlsOptions tls{.enabled = true, .ca_file = Path("missing.pem")};
  auto channel = MakeChannel("localhost:1", tls);
  ASSERT_FALSE(channel.ok());
  EXPECT_THAT(std::string(channel.status().message()), ::testing::HasSubstr("missing.pem"));
}

}  // namespace
}  // namespace cascade::common
