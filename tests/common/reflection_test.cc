// Server reflection (grpc.reflection.v1alpha, what grpcurl speaks to gRPC 1.51) lists every
// service, health included, and describes them. Debian ships no reflection .proto, so the test
// encodes and decodes the few protobuf fields it needs by hand.
#include <grpcpp/generic/generic_stub.h>

#include <set>
#include <string>
#include <vector>

#include "common/server_runner.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace cascade::common {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

void* Tag(intptr_t i) { return reinterpret_cast<void*>(i); }

// ServerReflectionRequest with one string field set (7 list_services, 4 file_containing_symbol).
std::string EncodeRequest(int field, const std::string& value) {
  std::string out;
  out.push_back(static_cast<char>((field << 3) | WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
  out.push_back(static_cast<char>(value.size()));  // values here are < 128 bytes
  out += value;
  return out;
}

// Sends one request on the bidi ServerReflectionInfo stream and returns the response bytes.
std::string ReflectionCall(const std::shared_ptr<grpc::Channel>& channel,
                           const std::string& request) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* got_tag;
  bool ok;
  auto step = [&](intptr_t want) {
    EXPECT_TRUE(cq.Next(&got_tag, &ok));
    EXPECT_EQ(got_tag, Tag(want));
    return ok;
  };
  call->StartCall(Tag(1));
  if (!step(1)) return "";
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, Tag(2));
  if (!step(2)) return "";
  call->WritesDone(Tag(3));
  step(3);
  grpc::ByteBuffer in;
  call->Read(&in, Tag(4));
  bool read_ok = step(4);
  grpc::Status status;
  call->Finish(&status, Tag(5));
  step(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
  if (!read_ok) return "";
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(in.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

// Returns every length-delimited value of `field` in a message.
std::vector<std::string> Fields(const std::string& message, int field) {
  std::vector<std::string> out;
  CodedInputStream in(reinterpret_cast<const uint8_t*>(message.data()),
                      static_cast<int>(message.size()));
  while (uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) == field &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      std::string value;
      if (!WireFormatLite::ReadBytes(&in, &value)) break;
      out.push_back(std::move(value));
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      break;
    }
  }
  return out;
}

class ReflectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.host = "127.0.0.1";
    o.handle_signals = false;
    runner_ = std::make_unique<ServerRunner>(o);
    runner_->AddService({&gateway_, cascade::v2::GatewayService::service_full_name()});
    ASSERT_TRUE(runner_->Start().ok());
    channel_ = *MakeChannel(runner_->local_address(), ClientTlsOptions{});
  }
  testing::PacedStreamService gateway_{1, absl::Milliseconds(1)};
  std::unique_ptr<ServerRunner> runner_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ReflectionTest, ListsEveryServiceIncludingHealthAndReflection) {
  // ServerReflectionResponse.list_services_response (6) -> service (1) -> name (1).
  std::string response = ReflectionCall(channel_, EncodeRequest(7, "*"));
  std::vector<std::string> lists = Fields(response, 6);
  ASSERT_EQ(lists.size(), 1u) << "no list_services_response";
  std::set<std::string> names;
  for (const std::string& service : Fields(lists[0], 1)) {
    for (const std::string& name : Fields(service, 1)) names.insert(name);
  }
  EXPECT_THAT(names, ::testing::IsSupersetOf({"cascade.v2.GatewayService", "grpc.health.v1.Health",
                                              "grpc.reflection.v1alpha.ServerReflection"}));
}

TEST_F(ReflectionTest, DescribesTheHealthService) {
  // file_descriptor_response (4) -> file_descriptor_proto (1, serialized FileDescriptorProto).
  std::string response = ReflectionCall(channel_, EncodeRequest(4, "grpc.health.v1.Health"));
  std::vector<std::string> files = Fields(response, 4);
  ASSERT_EQ(files.size(), 1u) << "no file_descriptor_response";
  std::vector<std::string> protos = Fields(files[0], 1);
  ASSERT_FALSE(protos.empty());
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(protos[0]));
  EXPECT_EQ(file.package(), "grpc.health.v1");
  ASSERT_EQ(file.service_size(), 1);
  EXPECT_EQ(file.service(0).name(), "Health");
  EXPECT_EQ(file.service(0).method_size(), 2);
}

}  // namespace
}  // namespace cascade::common
