// Requests and responses as the bytes gRPC carries. Every call reaches the daemon raw (see
// async_server.h) and parses its request here, so a request that does not decode is
// answered INVALID_ARGUMENT naming the message type (gRPC's typed handlers would answer a
// bare UNIMPLEMENTED, or end a stream as if the client had half-closed it). Thread-safe
// free functions.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace tensord::server {

// Parses `bytes` (left untouched) into `message`.
template <typename Message>
absl::Status ParseRequest(const grpc::ByteBuffer& bytes, Message* message) {
  grpc::ByteBuffer copy(bytes);  // shares the slices; the reader consumes its own copy
  grpc::ProtoBufferReader reader(&copy);
  if (!reader.status().ok() || !message->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(absl::StrCat("the request (", bytes.Length(),
                                                   " bytes) does not decode as ",
                                                   Message::descriptor()->full_name()));
  }
  return absl::OkStatus();
}

// Serializes `message` into `bytes` (replacing what was there).
template <typename Message>
absl::Status SerializeResponse(const Message& message, grpc::ByteBuffer* bytes) {
  bytes->Clear();  // the writer insists on an empty buffer
  bool own_buffer = false;
  grpc::Status status = grpc::SerializationTraits<Message>::Serialize(message, bytes, &own_buffer);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot serialize ", Message::descriptor()->full_name(),
                                            ": ", status.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace tensord::server
