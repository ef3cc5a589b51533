// Internal auth over loopback gRPC against the real registry and worker services of a Stack
// (mTLS with roles, the default): every internal RPC refuses a caller without a certificate or
// with one from another CA (UNAUTHENTICATED), and one whose role is not allowed
// (PERMISSION_DENIED); the allowed role gets through. A rogue RegisterWorker is refused, and a
// worker cannot act for another worker's id.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cascade/v2/registry.grpc.pb.h"
#include "gpu_worker/service/worker_service.h"
#include "tests/integration/stack.h"

namespace cascade::testing {
namespace {

using common::ClientTlsOptions;
using common::Role;
using common::testing::TestCerts;

// One unary call of `method` with an empty request (valid protobuf for every message), or with
// `request` bytes; a server-streaming method answers its status the same way.
grpc::Status Call(const std::string& address, const ClientTlsOptions& tls,
                  const std::string& method, const std::string& request = "") {
  auto channel = common::MakeChannel(address, tls);
  if (!channel.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, channel.status().ToString());
  grpc::GenericStub generic(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1);
  grpc::ByteBuffer resp;
  grpc::Status st;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  generic.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    st = s;
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  return st;
}

bool Refused(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         s.error_code() == grpc::StatusCode::PERMISSION_DENIED;
}

// TLS to an internal server without a client certificate.
ClientTlsOptions NoCert(std::string_view server_name) {
  ClientTlsOptions tls = TestCerts::Default().Client(Role::kAdmin, server_name);
  tls.cert_file.clear();
  tls.key_file.clear();
  return tls;
}

// A client certificate from another CA (trusting the real CA, so the server side is what fails).
ClientTlsOptions OtherCa(Role role, std::string_view server_name, std::string_view worker_id = "") {
  ClientTlsOptions tls = TestCerts::OtherCa().Client(role, server_name, worker_id);
  tls.ca_file = TestCerts::Default().paths().ca();
  return tls;
}

struct MethodCase {
  std::string method;
  std::set<Role> allowed;
};

std::vector<MethodCase> Cases(const common::MethodPolicy& policy) {
  std::vector<MethodCase> out;
  for (const auto& [method, roles] : policy) out.push_back({method, roles});
  return out;
}

// Role certificates to try, the worker one for `worker_id`.
const std::vector<Role> kRoles = {Role::kGateway, Role::kWorker, Role::kAdmin, Role::kRegistry};

void ExpectPolicyEnforced(const std::string& address, std::string_view server_name,
                          const common::MethodPolicy& policy, const std::string& worker_id) {
  const std::vector<MethodCase> cases = Cases(policy);
  ASSERT_FALSE(cases.empty());
  for (const MethodCase& c : cases) {
    SCOPED_TRACE(c.method);
    // Worker RPCs name the worker in field 1 (worker_id): name the certificate's own, so the
    // allowed role passes the handler's identity check too. Other requests stay empty.
    std::string body;
    if (c.allowed.contains(Role::kWorker)) {
      body = std::string("\x0a") + static_cast<char>(worker_id.size()) + worker_id;
    }
    grpc::Status none = Call(address, NoCert(server_name), c.method);
    EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
    EXPECT_THAT(none.error_message(), ::testing::HasSubstr("client certificate"));

    grpc::Status other = Call(address, OtherCa(Role::kAdmin, server_name), c.method);
    EXPECT_EQ(other.error_code(), grpc::StatusCode::UNAUTHENTICATED) << other.error_message();
    EXPECT_THAT(other.error_message(), ::testing::HasSubstr("cluster CA"));

    grpc::Status plaintext = Call(address, ClientTlsOptions{}, c.method);
    EXPECT_FALSE(plaintext.ok());
    EXPECT_EQ(plaintext.error_code(), grpc::StatusCode::UNAVAILABLE) << plaintext.error_message();

    for (Role role : kRoles) {
      grpc::Status st =
          Call(address, TestCerts::Default().Client(role, server_name, worker_id), c.method, body);
      if (c.allowed.contains(role)) {
        EXPECT_FALSE(Refused(st)) << common::RoleName(role) << ": " << st.error_message();
      } else {
        EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << common::RoleName(role) << ": " << st.error_message();
        EXPECT_THAT(st.error_message(), ::testing::HasSubstr("is for"));
      }
    }
  }
}

TEST(InternalAuthTest, EveryRegistryRpcNeedsAClusterCertificateWithAnAllowedRole) {
  Stack stack({.workers = 1});
  common::MethodPolicy policy = registry::RegistryMethodPolicy();
  EXPECT_EQ(policy.size(), 13u);  // every ChunkRegistry method is listed
  ExpectPolicyEnforced(stack.registry_address(), common::kRegistryServerName, policy, "w0");
}

TEST(InternalAuthTest, EveryWorkerRpcNeedsAClusterCertificateWithAnAllowedRole) {
  Stack stack({.workers = 1});
  common::MethodPolicy policy = worker::WorkerMethodPolicy();
  EXPECT_EQ(policy.size(), 4u);  // every WorkerService method is listed
  ExpectPolicyEnforced(stack.worker(0).address(), common::kWorkerServerName, policy, "w1");
  // And the gateway's traffic through it works (the stack runs secure).
  Reply r = Generate(stack.gateway(), Req("sys", "hello"));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
}

std::string RegisterEvil(const std::string& id) {
  v2::RegisterWorkerRequest req;
  req.set_worker_id(id);
  req.set_address("10.6.6.6:50061");
  req.set_model("tiny");
  req.set_block_size(16);
  return req.SerializeAsString();
}

TEST(InternalAuthTest, RogueRegisterWorkerIsRefused) {
  Stack stack({.workers = 1});
  const std::string method = "/cascade.v2.ChunkRegistryService/RegisterWorker";
  const std::string& addr = stack.registry_address();
  const std::string_view name = common::kRegistryServerName;
  const std::string evil = RegisterEvil("evil");
  EXPECT_EQ(Call(addr, NoCert(name), method, evil).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(addr, OtherCa(Role::kWorker, name, "w1"), method, evil).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(addr, ClientTlsOptions{}, method, evil).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  for (Role role : {Role::kGateway, Role::kAdmin, Role::kRegistry}) {
    EXPECT_EQ(Call(addr, TestCerts::Default().Client(role, name), method, evil).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  // A real worker's certificate registers only its own id.
  grpc::Status st =
      Call(addr, TestCerts::Default().Client(Role::kWorker, name, "w1"), method, evil);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(st.error_message(),
              ::testing::HasSubstr("cascade://worker/w1 may not act for worker 'evil'"));
  for (const auto& w : stack.registry()->ListWorkers()) EXPECT_NE(w.info.worker_id, "evil");
  // The same call for its own id is accepted: the refusals above are about identity only.
  st = Call(addr, TestCerts::Default().Client(Role::kWorker, name, "w1"), method,
            RegisterEvil("w1"));
  EXPECT_TRUE(st.ok()) << st.error_message();
}

TEST(InternalAuthTest, AWorkerCannotActForAnotherWorkersId) {
  Stack stack({.workers = 1});  // w0 registers and heartbeats
  ASSERT_TRUE(WaitFor([&] { return stack.registry()->ListWorkers().size() == 1; }));
  const std::string& addr = stack.registry_address();
  ClientTlsOptions w1 =
      TestCerts::Default().Client(Role::kWorker, common::kRegistryServerName, "w1");
  v2::HeartbeatRequest hb;
  hb.set_worker_id("w0");
  v2::ReportEventsRequest events;
  events.set_worker_id("w0");
  events.set_seq(1);
  v2::ResyncRequest resync;
  resync.set_worker_id("w0");
  v2::DeregisterWorkerRequest dereg;
  dereg.set_worker_id("w0");
  const std::vector<std::pair<std::string, std::string>> calls = {
      {"/cascade.v2.ChunkRegistryService/Heartbeat", hb.SerializeAsString()},
      {"/cascade.v2.ChunkRegistryService/ReportEvents", events.SerializeAsString()},
      {"/cascade.v2.ChunkRegistryService/Resync", resync.SerializeAsString()},
      {"/cascade.v2.ChunkRegistryService/DeregisterWorker", dereg.SerializeAsString()},
      {"/cascade.v2.ChunkRegistryService/RegisterWorker", RegisterEvil("w0")}};
  for (const auto& [method, body] : calls) {
    grpc::Status st = Call(addr, w1, method, body);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << method << ": " << st.error_message();
    EXPECT_THAT(st.error_message(), ::testing::HasSubstr("may not act for worker 'w0'"));
  }
  auto workers = stack.registry()->ListWorkers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].info.worker_id, "w0");
  EXPECT_EQ(workers[0].info.address, stack.worker(0).address());  // not overwritten by w1's try
  // An admin may deregister a worker (to remove a bad one).
  grpc::Status st =
      Call(addr, TestCerts::Default().Client(Role::kAdmin, common::kRegistryServerName),
           "/cascade.v2.ChunkRegistryService/DeregisterWorker", dereg.SerializeAsString());
  EXPECT_TRUE(st.ok()) << st.error_message();
}

TEST(InternalAuthTest, ClientsAcceptOnlyTheServerRoleTheyDial) {
  Stack stack({.workers = 1});
  // The registry's certificate is not a worker's: a gateway that dials the registry's address
  // as if it were a worker does not connect (the server proves its role too).
  grpc::Status st = Call(stack.registry_address(),
                         TestCerts::Default().Client(Role::kGateway, common::kWorkerServerName),
                         "/cascade.v2.ChunkRegistryService/Resolve");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  st = Call(stack.worker(0).address(),
            TestCerts::Default().Client(Role::kGateway, common::kRegistryServerName),
            "/cascade.v2.WorkerService/Generate");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
}

TEST(InternalAuthTest, HealthIsOpenToEveryClusterRoleButNotToStrangers) {
  Stack stack({.workers = 1});
  const std::string health = "/grpc.health.v1.Health/Check";
  for (Role role : kRoles) {
    grpc::Status st =
        Call(stack.registry_address(),
             TestCerts::Default().Client(role, common::kRegistryServerName, "w3"), health);
    EXPECT_TRUE(st.ok()) << common::RoleName(role) << ": " << st.error_message();
  }
  EXPECT_EQ(
      Call(stack.registry_address(), NoCert(common::kRegistryServerName), health).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
}

TEST(InternalAuthTest, AWorkerActsOnlyUnderItsCertificatesIdAndRole) {
  worker::WorkerConfig w;
  w.server = TestServerOptions("cascade-worker");
  w.model_dir = TinyModelDir();
  w.backend = "cpu";
  w.worker_id = "w1";
  w.internal_auth = StackAuth(false, Role::kWorker, "w0");
  auto s = worker::WorkerServer::Start(w);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(),
              ::testing::HasSubstr("--worker_id=w1 but --internal_cert names cascade://worker/w0"));
  w.worker_id = "";
  w.internal_auth = StackAuth(false, Role::kGateway);
  s = worker::WorkerServer::Start(w);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("not a worker certificate"));
  w.internal_auth = {};
  s = worker::WorkerServer::Start(w);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("--insecure_internal"));
  // Without --worker_id it takes the certificate's.
  w.internal_auth = StackAuth(false, Role::kWorker, "w5");
  s = worker::WorkerServer::Start(w);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->worker_id(), "w5");
}

TEST(InternalAuthTest, InsecureInternalOpensEveryRpc) {
  // What --insecure_internal means: plaintext, and anyone may register any worker.
  Stack stack({.workers = 1, .insecure_internal = true});
  grpc::Status st = Call(stack.registry_address(), ClientTlsOptions{},
                         "/cascade.v2.ChunkRegistryService/RegisterWorker", RegisterEvil("evil"));
  EXPECT_TRUE(st.ok()) << st.error_message();
  bool listed = false;
  for (const auto& w : stack.registry()->ListWorkers()) listed |= w.info.worker_id == "evil";
  EXPECT_TRUE(listed);
  Reply r = Generate(stack.gateway(), Req("sys", "hello"));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
}

}  // namespace
}  // namespace cascade::testing
