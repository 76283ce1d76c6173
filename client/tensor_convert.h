// Conversions between the broker's protobuf messages and the public API's structs, with the
// consumer-side validation DESIGN.md requires: every TensorInfo the broker sends is checked
// (common::ValidateDesc + common::ValidateFitsBuffer) before anything is built from it.
// Thread-safe pure functions.
//
// Errors: INVALID_ARGUMENT naming the field, for a spec the caller gave; DATA_LOSS naming the
// tensor, for a description the broker sent that does not hold together.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "client/dlpack_convert.h"  // the dtype and device conversions these build on
#include "common/tensor_desc.h"
#include "tensord/client.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::internal {

// A broker-sent tensor that passed validation: the public form plus its layout.
struct ValidatedTensor {
  TensorInfo info;
  common::TensorLayout layout;
  uint64_t buffer_offset = 0;  // where the tensor's extent starts in its buffer
};

// Validates `proto` and converts it. `what` names it in errors ("acquire 'ns/x'").
absl::StatusOr<ValidatedTensor> ValidateTensorInfo(const tensord::v1::TensorInfo& proto,
                                                   std::string_view what);

// The public TensorInfo of a description already validated; no checks.
TensorInfo ToPublicInfo(const tensord::v1::TensorInfo& proto, const common::TensorLayout& layout);

// The proto description of a caller's spec (checked with common::ValidateDesc too).
absl::StatusOr<tensord::v1::TensorDesc> SpecToDesc(const TensorSpec& spec);

TensorState ToPublicState(tensord::v1::TensorState state);
const char* TensorStateName(TensorState state);
LeaseHolder ToPublicHolder(const tensord::v1::LeaseHolder& holder);
BrokerStatus ToPublicStatus(const tensord::v1::StatusResponse& status);

}  // namespace tensord::internal
