#include "server/state/tensor_registry.h"

#include <vector>

#include "common/memory/host/host_backend.h"
#include "gtest/gtest.h"

namespace tensord::server {
namespace {

Tensor NamedTensor(TensorRegistry& registry, uint64_t buffer_id = 0) {
  Tensor tensor;
  tensor.id = registry.NextTensorId();
  tensor.buffer_id = buffer_id;
  return tensor;
}

TEST(TensorRegistry, BindReturnsThePreviousTensorAndClearsItsName) {
  TensorRegistry registry;
  uint64_t a_id = registry.AddTensor(NamedTensor(registry)).id;
  EXPECT_EQ(registry.Bind("ns/x", *registry.Find(a_id), registry.NextGeneration()), 0u);
  Tensor& b = registry.AddTensor(NamedTensor(registry));
  EXPECT_EQ(registry.Bind("ns/x", b, registry.NextGeneration()), a_id);
  EXPECT_TRUE(registry.Find(a_id)->name.empty());
  EXPECT_EQ(registry.FindByName("ns/x")->id, b.id);
  EXPECT_GT(b.generation, registry.Find(a_id)->generation);
}

TEST(TensorRegistry, UnbindOnlyRemovesItsOwnBinding) {
  TensorRegistry registry;
  uint64_t a_id = registry.AddTensor(NamedTensor(registry)).id;
  registry.Bind("ns/x", *registry.Find(a_id), registry.NextGeneration());
  Tensor& b = registry.AddTensor(NamedTensor(registry));
  registry.Bind("ns/x", b, registry.NextGeneration());
  registry.Unbind(*registry.Find(a_id));  // already replaced: must not drop b's binding
  EXPECT_EQ(registry.FindByName("ns/x")->id, b.id);
  registry.Unbind(b);
  EXPECT_EQ(registry.FindByName("ns/x"), nullptr);
}

TEST(TensorRegistry, RemovingTheLastTensorOfABufferHandsBackItsMemory) {
  TensorRegistry registry;
  common::HostBackend backend;
  auto memory = backend.Allocate(backend.devices().front(), 4096, "test");
  ASSERT_TRUE(memory.ok());
  Buffer buffer;
  buffer.id = registry.NextBufferId();
  buffer.size = 4096;
  buffer.memory = std::move(*memory);
  uint64_t buffer_id = buffer.id;
  registry.AddBuffer(std::move(buffer));
  uint64_t first = registry.AddTensor(NamedTensor(registry, buffer_id)).id;
  uint64_t second = registry.AddTensor(NamedTensor(registry, buffer_id)).id;
  EXPECT_EQ(registry.Remove(first), nullptr);  // the buffer still has a tensor
  EXPECT_NE(registry.FindBuffer(buffer_id), nullptr);
  EXPECT_NE(registry.Remove(second), nullptr);
  EXPECT_EQ(registry.FindBuffer(buffer_id), nullptr);
  EXPECT_EQ(registry.buffer_count(), 0u);
}

TEST(TensorRegistry, OldestUnderPicksTheLowestGenerationWithinThePrefixOnly) {
  TensorRegistry registry;
  // Ids, not references: adding tensors may move the ones already stored.
  uint64_t late = registry.AddTensor(NamedTensor(registry)).id;
  uint64_t early = registry.AddTensor(NamedTensor(registry)).id;
  uint64_t outside = registry.AddTensor(NamedTensor(registry)).id;
  registry.Bind("q/outside", *registry.Find(outside), registry.NextGeneration());  // not under "q/a/"
  registry.Bind("q/a/2", *registry.Find(early), registry.NextGeneration());
  registry.Bind("q/a/1", *registry.Find(late), registry.NextGeneration());
  EXPECT_EQ(registry.OldestUnder("q/a/")->id, early);
  EXPECT_EQ(registry.OldestUnder("q/b/"), nullptr);
  EXPECT_EQ(registry.OldestUnder("q/")->id, outside);
}

TEST(TensorRegistry, NearestBoundNameIsATypoAwayInTheSameNamespace) {
  TensorRegistry registry;
  for (const char* name : {"demo/weights", "demo/batch/0001", "other/weights", "demo/x"}) {
    registry.Bind(name, *registry.Find(registry.AddTensor(NamedTensor(registry)).id), registry.NextGeneration());
  }
  EXPECT_EQ(registry.NearestBoundName("demo/wieghts"), "demo/weights");
  EXPECT_EQ(registry.NearestBoundName("demo/weight"), "demo/weights");
  EXPECT_EQ(registry.NearestBoundName("demox/weights"), std::nullopt);  // another namespace
  EXPECT_EQ(registry.NearestBoundName("demo/batch/0002"), std::nullopt);  // a series, not a typo
  EXPECT_EQ(registry.NearestBoundName("demo/y"), std::nullopt);           // one letter is no typo of another
  EXPECT_EQ(registry.NearestBoundName("demo/completely-else"), std::nullopt);
}

TEST(TensorRegistry, OldestUnderFollowsRebindsAndUnbinds) {
  TensorRegistry registry;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(registry.AddTensor(NamedTensor(registry)).id);
  registry.Bind("q/a/x", *registry.Find(ids[0]), registry.NextGeneration());
  registry.Bind("q/b", *registry.Find(ids[1]), registry.NextGeneration());
  registry.Bind("q/a/y", *registry.Find(ids[2]), registry.NextGeneration());
  EXPECT_EQ(registry.OldestUnder("q/")->id, ids[0]);
  // Re-binding q/a/x to a new tensor: the old one leaves every queue, the new one is youngest.
  EXPECT_EQ(registry.Bind("q/a/x", *registry.Find(ids[3]), registry.NextGeneration()), ids[0]);
  EXPECT_EQ(registry.OldestUnder("q/")->id, ids[1]);
  EXPECT_EQ(registry.OldestUnder("q/a/")->id, ids[2]);
  registry.Unbind(*registry.Find(ids[2]));
  EXPECT_EQ(registry.OldestUnder("q/a/")->id, ids[3]);
  registry.Unbind(*registry.Find(ids[1]));
  registry.Unbind(*registry.Find(ids[3]));
  EXPECT_EQ(registry.OldestUnder("q/"), nullptr);
  EXPECT_EQ(registry.OldestUnder("q/a/"), nullptr);
  // Unbinding a tensor twice, or one whose name moved on, changes nothing.
  registry.Unbind(*registry.Find(ids[0]));
  EXPECT_EQ(registry.OldestUnder("q/"), nullptr);
}

TEST(TensorRegistry, DescribeFillsStridesAndBuffer) {
  TensorRegistry registry;
  Tensor tensor = NamedTensor(registry);
  tensor.desc.mutable_dtype()->set_code(tensord::v1::DTYPE_CODE_FLOAT);
  tensor.desc.mutable_dtype()->set_bits(32);
  tensor.desc.mutable_dtype()->set_lanes(1);
  tensor.desc.add_shape(2);
  tensor.desc.add_shape(3);
  tensor.desc.mutable_device()->set_type(tensord::v1::DEVICE_TYPE_CPU);
  tensor.layout = *common::ValidateDesc(tensor.desc);
  Tensor& added = registry.AddTensor(std::move(tensor));
  tensord::v1::TensorInfo info = registry.Describe(added);
  ASSERT_EQ(info.desc().strides_size(), 2);
  EXPECT_EQ(info.desc().strides(0), 3);
  EXPECT_EQ(info.desc().strides(1), 1);
  EXPECT_EQ(info.nbytes(), 24u);
}

}  // namespace
}  // namespace tensord::server
