#include "client/dlpack_context.h"

#include <cstddef>
#include <type_traits>

#include "client/lease_view.h"
#include "gtest/gtest.h"
#include "tests/unit/client/test_views.h"

#if __has_include(<dlpack/dlpack.h>)
#include <dlpack/dlpack.h>
// tensord's legacy struct must be usable as the system's (dlpack 0.6) through a cast.
static_assert(sizeof(::DLManagedTensor) == sizeof(tensord::DLManagedTensor));
static_assert(offsetof(::DLManagedTensor, manager_ctx) ==
              offsetof(tensord::DLManagedTensor, manager_ctx));
static_assert(offsetof(::DLManagedTensor, deleter) == offsetof(tensord::DLManagedTensor, deleter));
static_assert(offsetof(::DLTensor, byte_offset) == offsetof(tensord::DLTensor, byte_offset));
static_assert(offsetof(::DLTensor, strides) == offsetof(tensord::DLTensor, strides));
#endif

namespace tensord::internal {
namespace {

using testing::NewPatternMapping;
using testing::NewQueue;

LeaseView* NewView(const std::shared_ptr<ReleaseQueue>& queue, ViewKind kind) {
  LeaseView::Params p;
  p.info.tensor_id = 3;
  p.info.dtype = dtypes::kFloat32;
  p.info.shape = {2, 3};
  p.info.strides = {1, 2};  // Fortran order
  p.info.byte_offset = 8;
  p.info.nbytes = 24;
  p.lease_id = 9;
  p.kind = kind;
  p.mapping = NewPatternMapping(4096, MapModeOf(kind));
  p.offset_in_mapping = 64 + 8;  // buffer offset of the extent + byte_offset
  return new LeaseView(std::move(p), queue);
}

TEST(DLPackContextTest, LegacyViewDescribesTheTensorAndHoldsAReference) {
  auto queue = NewQueue();
  LeaseView* view = NewView(queue, ViewKind::kPrivate);
  DLManagedTensor* m = MakeDLPack(view);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(view->refs(), 2u);
  const DLTensor& t = m->dl_tensor;
  // byte_offset is folded into the pointer: element 0 is at buffer offset 64 + 8.
  EXPECT_EQ(t.data, view->data());
  EXPECT_EQ(static_cast<const uint8_t*>(t.data)[0], (64 + 8) % 251);
  EXPECT_EQ(t.byte_offset, 0u);
  EXPECT_EQ(t.ndim, 2);
  EXPECT_EQ(t.shape[0], 2);
  EXPECT_EQ(t.shape[1], 3);
  ASSERT_NE(t.strides, nullptr);
  EXPECT_EQ(t.strides[0], 1);
  EXPECT_EQ(t.strides[1], 2);
  EXPECT_EQ(t.dtype.code, kDLFloat);
  EXPECT_EQ(t.dtype.bits, 32);
  EXPECT_EQ(t.dtype.lanes, 1);
  EXPECT_EQ(t.device.device_type, kDLCPU);
  EXPECT_NE(m->manager_ctx, nullptr);
  m->deleter(m);
  EXPECT_EQ(view->refs(), 1u);
  view->Unref();
  // The queue has no sender: the view waits there, at refcount zero.
  std::vector<LeaseView*> queued = queue->PopAll();
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_EQ(queued[0], view);
  delete view;
}

TEST(DLPackContextTest, VersionedViewCarriesVersionAndReadOnlyFlag) {
  auto queue = NewQueue();
  LeaseView* ro = NewView(queue, ViewKind::kReadOnly);
  LeaseView* rw = NewView(queue, ViewKind::kPrivate);
  DLManagedTensorVersioned* a = MakeDLPackVersioned(ro);
  DLManagedTensorVersioned* b = MakeDLPackVersioned(rw);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->version.major, 1u);
  EXPECT_EQ(a->version.minor, 0u);
  EXPECT_EQ(a->flags & kDLFlagBitMaskReadOnly, kDLFlagBitMaskReadOnly);
  EXPECT_EQ(b->flags & kDLFlagBitMaskReadOnly, 0u);
  EXPECT_EQ(a->dl_tensor.ndim, 2);
  EXPECT_EQ(a->dl_tensor.strides[1], 2);
  EXPECT_TRUE(ro->readonly());
  EXPECT_FALSE(rw->readonly());
  a->deleter(a);
  b->deleter(b);
  ro->Unref();
  rw->Unref();
  for (LeaseView* v : queue->PopAll()) delete v;
}

TEST(DLPackContextTest, ZeroByteTensorGetsANonNullDataPointer) {
  auto queue = NewQueue();
  LeaseView* view = testing::NewBareView(queue, 4);
  DLManagedTensor* m = MakeDLPack(view);
  ASSERT_NE(m, nullptr);
  EXPECT_NE(m->dl_tensor.data, nullptr);
  EXPECT_EQ(m->dl_tensor.ndim, 1);
  EXPECT_EQ(m->dl_tensor.shape[0], 0);
  m->deleter(m);
  view->Unref();
  for (LeaseView* v : queue->PopAll()) delete v;
}

TEST(DLPackContextTest, ZeroDimTensorHasNonNullShapeAndStrides) {
  auto queue = NewQueue();
  LeaseView::Params p;
  p.info.tensor_id = 5;
  p.info.dtype = dtypes::kInt64;
  p.info.nbytes = 8;
  p.mapping = NewPatternMapping(4096, common::MapMode::kPrivate);
  auto* view = new LeaseView(std::move(p), queue);
  DLManagedTensorVersioned* m = MakeDLPackVersioned(view);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->dl_tensor.ndim, 0);
  EXPECT_NE(m->dl_tensor.shape, nullptr);
  EXPECT_NE(m->dl_tensor.strides, nullptr);
  m->deleter(m);
  view->Unref();
  for (LeaseView* v : queue->PopAll()) delete v;
}

}  // namespace
}  // namespace tensord::internal
