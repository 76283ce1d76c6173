#include "client/allocate_ahead.h"

#include <utility>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace tensord::internal {

std::string AllocateAhead::KeyOf(const tensord::v1::AllocateRequest& allocate) {
  tensord::v1::AllocateRequest bare = allocate;
  bare.clear_reuse_buffer_ids();
  std::string key;
  {
    google::protobuf::io::StringOutputStream out(&key);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    bare.SerializeToCodedStream(&coded);
  }
  return key;
}

void AllocateAhead::Put(Entry entry) {
  std::optional<Entry> given_up;  // destroyed outside the lock: it may call the orphan handler
  absl::MutexLock lock(&mu_);
  given_up = std::exchange(kept_, std::move(entry));
}

std::optional<AllocateAhead::Entry> AllocateAhead::Take() {
  absl::MutexLock lock(&mu_);
  return std::exchange(kept_, std::nullopt);
}

}  // namespace tensord::internal
