// Parsing requests that arrive raw (ByteBuffer), so that a string field holding invalid UTF-8 is
// answered INVALID_ARGUMENT naming the field ("chunks[1].text is not valid UTF-8") instead of
// protobuf's opaque parse failure. The check walks the wire format alongside the message's
// descriptor, so it serves every request type without a hand-written twin.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"

namespace cascade::gateway {

// Checks every string field (recursively through sub-messages) of the serialized message
// `bytes` of type `descriptor`. InvalidArgument naming the first bad field.
absl::Status CheckUtf8Fields(std::string_view bytes,
                             const google::protobuf::Descriptor* descriptor);

// The ByteBuffer's bytes, concatenated.
absl::StatusOr<std::string> ByteBufferToString(const grpc::ByteBuffer& raw);

// A request larger than `max_bytes` is refused before it is copied or parsed (RESOURCE_EXHAUSTED):
// parsing copies it several times over, so size must be checked first.
template <typename Msg>
absl::StatusOr<Msg> ParseRawRequest(const grpc::ByteBuffer& raw, size_t max_bytes) {
  if (raw.Length() > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the request is ", raw.Length(), " bytes, at most ", max_bytes,
                     " (raise --max_prompt_bytes for longer prompts)"));
  }
  absl::StatusOr<std::string> bytes = ByteBufferToString(raw);
  if (!bytes.ok()) return bytes.status();
  if (absl::Status s = CheckUtf8Fields(*bytes, Msg::descriptor()); !s.ok()) return s;
  Msg msg;
  if (!msg.ParseFromString(*bytes)) {
    return absl::InvalidArgumentError("the request is not a valid " +
                                      Msg::descriptor()->full_name());
  }
  return msg;
}

// Serializes `msg` into `out` (which must be empty) for a raw write.
template <typename Msg>
void SerializeToByteBuffer(const Msg& msg, grpc::ByteBuffer* out) {
  out->Clear();
  bool own = false;
  grpc::GenericSerialize<grpc::ProtoBufferWriter, Msg>(msg, out, &own);
}

}  // namespace cascade::gateway
