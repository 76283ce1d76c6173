// The Python `Tensor` class (tensord._tensord.Tensor): one TensorRef (the handle's own
// reference) plus a snapshot of its description. DLPack capsules and array views made from
// it hold their own references, so release() drops only the handle's.
//
// Errors: BufferError for DLPack requests that cannot be honoured; ValueError for a released
// tensor. Used with the GIL held; calls that block (UseOnStream) release it.
#pragma once

#include <Python.h>

#include <cstdint>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>

#include "tensord/client.h"

namespace tensord::python {

class PyTensor {
 public:
  // `producer`: a tensor from empty(), which publish() publishes in place. `client`: the
  // one that holds its lease (a hand-over is made there), not kept alive by the tensor.
  PyTensor(TensorRef ref, bool producer, const std::shared_ptr<Client>& client)
      : info_(ref.info()),
        readonly_(ref.readonly()),
        producer_(producer),
        client_(client),
        ref_(std::make_shared<TensorRef>(std::move(ref))) {}

  const TensorInfo& info() const { return info_; }
  void set_info(TensorInfo info) { info_ = std::move(info); }
  bool readonly() const { return readonly_; }
  // A view of host memory another kind's driver registered (cuda_host: get(pinned=True)).
  bool pinned() const {
    const MemoryKindInfo* kind = FindMemoryKind(info_.device.device_type);
    return kind != nullptr && kind->host_readable && !kind->own_memory;
  }
  bool producer() const { return producer_; }
  bool released() const { return ref_ == nullptr; }
  // A plain empty() (no ns=): nullopt for any other tensor; else the namespace its client
  // chose for it from where it publishes plain tensors ("": none, a dedicated buffer).
  const std::optional<std::string>& plain_ns() const { return plain_ns_; }
  void set_plain_ns(std::string ns) { plain_ns_ = std::move(ns); }
  // The bounded work queue whose empty() made it ("" for any other tensor).
  const std::string& queue() const { return queue_; }
  void set_queue(std::string prefix) { queue_ = std::move(prefix); }
  // The handle now refers to `ref` (what a publish published in its place).
  void Replace(TensorRef ref) {
    info_ = ref.info();
    ref_ = std::make_shared<TensorRef>(std::move(ref));
  }

  // The handle's reference; ValueError once released. Shared so that a call running without
  // the GIL keeps the TensorRef alive if another thread releases the handle meanwhile.
  std::shared_ptr<TensorRef> Ref() const;

  void Release() { ref_.reset(); }

  // "'ns/x'", or "#<id>" for a tensor without a name.
  std::string Describe() const;

  pybind11::tuple Device() const;

  // __dlpack__(stream, max_version, dl_device, copy), the DLPack exchange protocol.
  pybind11::object DLPack(pybind11::object stream, pybind11::object max_version,
                          pybind11::object dl_device, pybind11::object copy) const;

  void UseOnStream(uintptr_t stream) const;

  // to_dlpack(): an unversioned capsule for a consumer that takes one and no stream
  // (TensorFlow's from_dlpack): the producer's writes waited for on the host first, strides
  // compact row-major, byte_offset 0 (folded into the data pointer). BufferError for a
  // read-only view (a legacy capsule cannot say so) or strides that are not compact.
  pybind11::object ToStreamlessCapsule() const;

  // A legacy capsule for .torch(): elements reinterpreted as `as_dtype` (same size), and a
  // read-only mapping allowed (the caller warns).
  pybind11::object LegacyCapsuleAs(const std::string& as_dtype) const;

  pybind11::object NumpyArray() const;

  uintptr_t DataPtr() const;

  // A hand-over token for this tensor (Client::HandOver) and the socket of the broker that
  // made it: what a pickled Tensor carries. ValueError when released or its client is closed.
  pybind11::tuple HandOver(std::optional<double> ttl_seconds) const;

 private:
  TensorInfo info_;
  bool readonly_;
  bool producer_;
  std::weak_ptr<Client> client_;
  std::shared_ptr<TensorRef> ref_;  // null once released
  std::optional<std::string> plain_ns_;
  std::string queue_;
};

// TensorFlow's rule for the strides of a capsule it takes: every dimension longer than 1
// has the stride of a compact row-major layout; empty strides are compact.
bool CompactRowMajor(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides);

// Adds the class `Tensor` to `m`.
void BindTensor(pybind11::module_& m);

}  // namespace tensord::python
