// PublishFilled: a float32[count] tensor filled with `value`, allocated in the namespace of
// `name` and published as `name`. Needs only the client library, so the test peer (which
// has no gtest) and the gtest suites share it.
#pragma once

#include <cstdint>
#include <string>

#include "tensord/client.h"

namespace tensord::testing {

inline Result<TensorInfo> PublishFilled(Client& client, const std::string& name, int64_t count,
                                        float value) {
  TensorSpec spec;
  spec.dtype = dtypes::kFloat32;
  spec.shape = {count};
  auto tensor = client.Allocate(name.substr(0, name.find('/')), spec);
  if (!tensor.ok()) return tensor.status();
  float* data = static_cast<float*>(tensor->mutable_data());
  for (int64_t i = 0; i < count; ++i) data[i] = value;
  return client.Publish(*tensor, name);
}

}  // namespace tensord::testing
