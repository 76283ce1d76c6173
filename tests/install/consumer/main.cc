// Publishes a tensor and acquires it back as DLPack through an installed tensord.
#include <cstdio>
#include <cstring>

#include <tensord/client.h>

int main() {
  auto client = tensord::Client::Connect();
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  tensord::TensorSpec spec;
  spec.dtype = tensord::dtypes::kInt32;
  spec.shape = {2, 3};
  auto tensor = (*client)->Allocate("demo", spec);
  if (!tensor.ok()) return std::fprintf(stderr, "%s\n", tensor.status().ToString().c_str()), 1;
  int32_t* data = static_cast<int32_t*>(tensor->mutable_data());
  for (int i = 0; i < 6; ++i) data[i] = i * 10;
  auto published = (*client)->Publish(*tensor, "demo/matrix");
  if (!published.ok()) return std::fprintf(stderr, "%s\n", published.status().ToString().c_str()), 1;

  auto acquired = (*client)->Acquire("demo/matrix");
  if (!acquired.ok()) return std::fprintf(stderr, "%s\n", acquired.status().ToString().c_str()), 1;
  tensord::DLManagedTensorVersioned* view = acquired->ToDLPackVersioned();
  const int32_t* values = static_cast<const int32_t*>(view->dl_tensor.data);
  bool good = view->dl_tensor.ndim == 2 && view->dl_tensor.shape[1] == 3 && values[5] == 50;
  view->deleter(view);
  std::printf(good ? "consumer: OK\n" : "consumer: wrong data\n");
  return good ? 0 : 1;
}
