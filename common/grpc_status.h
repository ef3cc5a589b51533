// absl::Status <-> grpc::Status. The codes are numerically the same (abseil documents them as
// the gRPC codes), so the conversion keeps code and message (capped: bounded_text.h). Used only at
// service boundaries.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "common/bounded_text.h"

namespace cascade::common {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())),
                      CapStatusMessage(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())),
                      s.error_message());
}

}  // namespace cascade::common
