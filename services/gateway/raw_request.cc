// Wire-format UTF-8 check; see raw_request.h.
#include "services/gateway/raw_request.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/unknown_field_set.h"
#include "services/tokenizer/tokenizer.h"

namespace cascade::gateway {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

absl::Status Check(std::string_view bytes, const Descriptor* d, const std::string& prefix,
                   int depth) {
  if (depth > 32) return absl::InvalidArgumentError("the request nests too deeply");
  UnknownFieldSet fields;  // schema-free parse: no UTF-8 validation here
  if (!fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("the request is not a valid ", d->full_name()));
  }
  std::map<int, int> seen;  // field number -> occurrences so far (index of repeated fields)
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& f = fields.field(i);
    const int index = seen[f.number()]++;
    const FieldDescriptor* fd = d->FindFieldByNumber(f.number());
    if (fd == nullptr || f.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    std::string name = prefix + fd->name();
    if (fd->is_repeated()) absl::StrAppend(&name, "[", index, "]");
    if (fd->type() == FieldDescriptor::TYPE_STRING) {
      if (!tokenizer::IsValidUtf8(f.length_delimited())) {
        return absl::InvalidArgumentError(name + " is not valid UTF-8");
      }
    } else if (fd->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (absl::Status s = Check(f.length_delimited(), fd->message_type(), name + ".", depth + 1);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckUtf8Fields(std::string_view bytes, const Descriptor* descriptor) {
  return Check(bytes, descriptor, "", 0);
}

absl::StatusOr<std::string> ByteBufferToString(const grpc::ByteBuffer& raw) {
  std::vector<grpc::Slice> slices;
  if (!raw.Dump(&slices).ok()) return absl::InvalidArgumentError("unreadable request");
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes;
}

}  // namespace cascade::gateway
