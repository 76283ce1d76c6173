#include "client/dlpack_context.h"

#include <new>
#include <vector>

namespace tensord::internal {
namespace {

// One template for both DLPack forms: the context owns everything the struct points at.
template <typename Managed>
struct DLPackContext {
  Managed managed{};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  LeaseView* view = nullptr;  // one reference, dropped by the deleter
};

template <typename Managed>
void Deleter(Managed* self) noexcept {
  if (self == nullptr) return;
  auto* ctx = static_cast<DLPackContext<Managed>*>(self->manager_ctx);
  LeaseView* view = ctx->view;
  delete ctx;
  // Last: a zero count hands the view to the release queue (lock-free), or frees it
  // inline once the sender is stopped.
  view->Unref();
}

template <typename Managed>
Managed* Make(LeaseView* view) noexcept {
  auto* ctx = new (std::nothrow) DLPackContext<Managed>();
  if (ctx == nullptr) return nullptr;
  try {
    ctx->shape = view->info().shape;
    ctx->strides = view->info().strides;
  } catch (...) {
    delete ctx;
    return nullptr;
  }
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = view->data();
  t.device = view->info().device;
  t.ndim = static_cast<int32_t>(ctx->shape.size());
  t.dtype = view->info().dtype;
  // A 0-d tensor still gets non-null arrays; data() of an empty vector may be null.
  static int64_t kNoDims[1] = {0};
  t.shape = ctx->shape.empty() ? kNoDims : ctx->shape.data();
  t.strides = ctx->strides.empty() ? kNoDims : ctx->strides.data();
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = &Deleter<Managed>;
  view->Ref();
  ctx->view = view;
  return &ctx->managed;
}

}  // namespace

DLManagedTensor* MakeDLPack(LeaseView* view) noexcept { return Make<DLManagedTensor>(view); }

DLManagedTensorVersioned* MakeDLPackVersioned(LeaseView* view) noexcept {
  DLManagedTensorVersioned* m = Make<DLManagedTensorVersioned>(view);
  if (m == nullptr) return nullptr;
  m->version = DLPackVersion{kDLPackMajorVersion, kDLPackMinorVersion};
  m->flags = view->readonly() ? kDLFlagBitMaskReadOnly : 0;
  return m;
}

}  // namespace tensord::internal
