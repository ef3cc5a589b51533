// Request validation: every error names the offending field, so a caller can fix its request
// from the message alone.
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cache_service/registry/registry_internal.h"

namespace cascade::registry::internal {
namespace {

bool IsIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == '@' || c == '-';
}

// Quotes untrusted text for an error message, bounded and escaped.
std::string Quote(std::string_view s) {
  std::string out = absl::StrCat("'", absl::CHexEscape(AV(s.substr(0, 64))));
  if (s.size() > 64) out += "...";
  return out + "'";
}

}  // namespace

absl::Status ValidateWorkerId(std::string_view id) {
  bool ok = !id.empty() && id.size() <= kMaxWorkerIdBytes;
  for (char c : id) ok = ok && IsIdChar(c);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("worker_id: ", Quote(id), " must be 1..128 characters of [A-Za-z0-9._:@-]"));
}

absl::Status ValidateHeldChunk(const HeldChunk& c, std::string_view field) {
  if (c.hash.IsZero()) {
    return absl::InvalidArgumentError(absl::StrCat(AV(field), ".hash: must not be all zeros"));
  }
  if (c.start < 0 || c.start > kMaxPosition) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ".start: ", c.start, " is outside [0, 2^40]"));
  }
  if (c.end < c.start || c.end > kMaxPosition) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ".end: ", c.end, " must be in [start=", c.start, ", 2^40]"));
  }
  if (c.held_tokens < 0 || c.held_tokens > c.end) {
    return absl::InvalidArgumentError(absl::StrCat(AV(field), ".held_tokens: ", c.held_tokens,
                                                   " must be in [0, end=", c.end, "]"));
  }
  if (c.kind <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(AV(field), ".kind: must be set"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLoad(const WorkerLoad& load) {
  if (load.running < 0 || load.waiting < 0 || load.free_kv_blocks < 0 || load.total_kv_blocks < 0) {
    return absl::InvalidArgumentError(
        "load: running, waiting, free_kv_blocks and total_kv_blocks must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateWorkerInfo(const WorkerInfo& info) {
  if (absl::Status s = ValidateWorkerId(info.worker_id); !s.ok()) return s;
  if (info.address.empty() || info.address.find(':') == std::string::npos ||
      info.address.size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: ", Quote(info.address), " must be host:port"));
  }
  if (info.model.empty() || info.model.size() > kMaxModelBytes) {
    return absl::InvalidArgumentError("model: must be 1..256 bytes");
  }
  if (info.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size: must be > 0, got ", info.block_size));
  }
  if (info.kv_capacity_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_capacity_blocks: must be >= 0, got ", info.kv_capacity_blocks));
  }
  bool printable = info.kv_numerics.size() <= kMaxKvNumericsBytes;
  for (char c : info.kv_numerics) printable = printable && c >= 0x20 && c <= 0x7e;
  if (!printable) {
    return absl::InvalidArgumentError(absl::StrCat("kv_numerics: ", Quote(info.kv_numerics),
                                                   " must be 0..128 printable ASCII characters"));
  }
  return absl::OkStatus();
}

}  // namespace cascade::registry::internal
