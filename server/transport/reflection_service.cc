#include "server/transport/reflection_service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/reflection/v1alpha/reflection.pb.h"
#include "server/transport/grpc_status.h"
#include "server/transport/wire_messages.h"

namespace tensord::server {

namespace reflection = grpc::reflection::v1alpha;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

namespace {

constexpr char kInfoMethod[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

void SetError(reflection::ServerReflectionResponse* response, grpc::StatusCode code, std::string message) {
  response->mutable_error_response()->set_error_code(static_cast<int>(code));
  response->mutable_error_response()->set_error_message(std::move(message));
}

// `file` and, depth first, every file it imports, each once.
void AddFileAndDependencies(const FileDescriptor* file, absl::flat_hash_set<std::string>* seen,
                            reflection::FileDescriptorResponse* out) {
  if (!seen->insert(std::string(file->name())).second) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  proto.SerializeToString(out->add_file_descriptor_proto());
  for (int i = 0; i < file->dependency_count(); ++i) AddFileAndDependencies(file->dependency(i), seen, out);
}

// Every extension of `type` declared in `message` or the messages nested in it.
void CollectExtensions(const google::protobuf::Descriptor* message, const google::protobuf::Descriptor* type,
                       reflection::ExtensionNumberResponse* out) {
  for (int i = 0; i < message->extension_count(); ++i) {
    if (message->extension(i)->containing_type() == type) out->add_extension_number(message->extension(i)->number());
  }
  for (int i = 0; i < message->nested_type_count(); ++i) CollectExtensions(message->nested_type(i), type, out);
}

// Every extension of `type` declared in `file` or the files it imports, each file once.
// (Walks the descriptors rather than asking DescriptorPool::FindAllExtensions, whose lock
// is taken inside libprotobuf and released in inlined header code.)
void CollectExtensions(const FileDescriptor* file, const google::protobuf::Descriptor* type,
                       absl::flat_hash_set<std::string>* seen, reflection::ExtensionNumberResponse* out) {
  if (!seen->insert(std::string(file->name())).second) return;
  for (int i = 0; i < file->extension_count(); ++i) {
    if (file->extension(i)->containing_type() == type) out->add_extension_number(file->extension(i)->number());
  }
  for (int i = 0; i < file->message_type_count(); ++i) CollectExtensions(file->message_type(i), type, out);
  for (int i = 0; i < file->dependency_count(); ++i) CollectExtensions(file->dependency(i), type, seen, out);
}

void AnswerWithFile(const FileDescriptor* file, const std::string& what,
                    reflection::ServerReflectionResponse* response) {
  if (file == nullptr) {
    return SetError(response, grpc::StatusCode::NOT_FOUND, absl::StrCat("tensord knows no ", what));
  }
  absl::flat_hash_set<std::string> seen;
  AddFileAndDependencies(file, &seen, response->mutable_file_descriptor_response());
}

// One ServerReflectionInfo stream: read a request, write its answer, read the next.
class ReflectionInfo final : public ServerCall {
 public:
  explicit ReflectionInfo(std::vector<std::string> services) : services_(std::move(services)) {}

 private:
  void OnStart() override { StartRead(&request_bytes_); }

  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);  // the client is done asking
    reflection::ServerReflectionRequest request;
    if (absl::Status parsed = ParseRequest(request_bytes_, &request); !parsed.ok()) {
      return Finish(ToGrpcStatus(parsed));
    }
    reflection::ServerReflectionResponse response = Answer(request);
    if (absl::Status serialized = SerializeResponse(response, &reply_bytes_); !serialized.ok()) {
      return Finish(ToGrpcStatus(serialized));
    }
    StartWrite(&reply_bytes_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the reflection client went away"));
    StartRead(&request_bytes_);
  }

  reflection::ServerReflectionResponse Answer(const reflection::ServerReflectionRequest& request) const {
    const DescriptorPool* pool = DescriptorPool::generated_pool();
    reflection::ServerReflectionResponse response;
    response.set_valid_host(request.host());
    *response.mutable_original_request() = request;
    switch (request.message_request_case()) {
      case reflection::ServerReflectionRequest::kListServices:
        for (const std::string& name : services_) {
          response.mutable_list_services_response()->add_service()->set_name(name);
        }
        break;
      case reflection::ServerReflectionRequest::kFileByFilename:
        AnswerWithFile(pool->FindFileByName(request.file_by_filename()),
                       absl::StrCat("file ", request.file_by_filename()), &response);
        break;
      case reflection::ServerReflectionRequest::kFileContainingSymbol:
        AnswerWithFile(pool->FindFileContainingSymbol(request.file_containing_symbol()),
                       absl::StrCat("symbol ", request.file_containing_symbol()), &response);
        break;
      case reflection::ServerReflectionRequest::kFileContainingExtension: {
        const auto& asked = request.file_containing_extension();
        const auto* type = pool->FindMessageTypeByName(asked.containing_type());
        const auto* extension = type == nullptr ? nullptr : pool->FindExtensionByNumber(type, asked.extension_number());
        AnswerWithFile(extension == nullptr ? nullptr : extension->file(),
                       absl::StrCat("extension ", asked.extension_number(), " of ", asked.containing_type()),
                       &response);
        break;
      }
      case reflection::ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const auto* type = pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
        if (type == nullptr) {
          SetError(&response, grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("tensord knows no message type ", request.all_extension_numbers_of_type()));
          break;
        }
        // The extensions a client can see: those in the files of the served services.
        auto* numbers = response.mutable_all_extension_numbers_response();
        numbers->set_base_type_name(std::string(type->full_name()));
        absl::flat_hash_set<std::string> seen;
        for (const std::string& name : services_) {
          if (const auto* service = pool->FindServiceByName(name); service != nullptr) {
            CollectExtensions(service->file(), type, &seen, numbers);
          }
        }
        break;
      }
      case reflection::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        SetError(&response, grpc::StatusCode::INVALID_ARGUMENT, "a reflection request that asks for nothing");
        break;
    }
    return response;
  }

  const std::vector<std::string> services_;
  grpc::ByteBuffer request_bytes_;
  grpc::ByteBuffer reply_bytes_;
};

}  // namespace

void ReflectionService::Register(AsyncServer* server) {
  server->Handle(kInfoMethod, [server](const grpc::GenericServerContext&) {
    return std::make_unique<ReflectionInfo>(server->ServiceNames());
  });
}

}  // namespace tensord::server
