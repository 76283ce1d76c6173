// DLPack views of a LeaseView. Each view is one heap object (DLPackContext) that owns the
// DLManagedTensor(Versioned) it hands out, the shape and strides arrays it points at, and
// one reference to the LeaseView. The deleter deletes the context and drops that
// reference: it never blocks (no mutex, no RPC, no GIL), is noexcept, and may run on any
// thread, also after the Client is gone or during exit.
//
// Layout: `data` points at element 0 (the tensor's byte_offset is folded into the
// pointer) and `byte_offset` is 0, because some importers ignore byte_offset; strides are
// always filled in. A read-only view sets kDLFlagBitMaskReadOnly in the versioned form.
// Building allocates; MakeDLPack returns null only when allocation fails.
#pragma once

#include "client/lease_view.h"
#include "tensord/dlpack.h"

namespace tensord::internal {

// A new legacy DLPack view; takes a new reference on `view`.
DLManagedTensor* MakeDLPack(LeaseView* view) noexcept;
// A new versioned DLPack view; takes a new reference on `view`.
DLManagedTensorVersioned* MakeDLPackVersioned(LeaseView* view) noexcept;

}  // namespace tensord::internal
