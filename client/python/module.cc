// tensord._tensord: the C++ half of `import tensord` (the Python package re-exports it with a
// cleaner API). Classes:
//   _Client  one tensord::Client; every call releases the GIL while it talks to the broker;
//            waits run as bounded broker waits with signal checks between them, so Ctrl-C
//            interrupts them and the total deadline holds. Any number of threads may share it.
//   Tensor   one TensorRef (the handle's own reference) plus a snapshot of its description;
//            DLPack capsules and array views made from it hold their own references, so
//            release() drops only the handle's.
//   _Watcher a stream of binding changes.
//   _Source  memory that put() copies (see py_source.h).
//   _ArrayView the owner of a .numpy() array's memory.
// Errors: tensord.Error subclasses (py_errors.h); BufferError for DLPack requests that cannot
// be honoured; ValueError for a released tensor or a closed client.
//
// This module links only the shared client library (never tensord_common / tensord_proto:
// a second copy of the generated protobuf code in one process aborts at startup).
#include <Python.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "absl/synchronization/mutex.h"
#include "py_convert.h"
#include "py_dlpack.h"
#include "py_errors.h"
#include "py_gil.h"
#include "py_source.h"
#include "tensord/client.h"

namespace tensord::python {
namespace {

namespace py = pybind11;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The longest single broker wait: the bound on how late Ctrl-C is noticed.
constexpr milliseconds kWaitSlice{150};

class PyTensor {
 public:
  PyTensor(TensorRef ref, bool producer)
      : info_(ref.info()),
        readonly_(ref.readonly()),
        producer_(producer),
        ref_(std::make_shared<TensorRef>(std::move(ref))) {}

  const TensorInfo& info() const { return info_; }
  void set_info(TensorInfo info) { info_ = std::move(info); }
  bool readonly() const { return readonly_; }
  bool pinned() const { return info_.device.device_type == kDLCUDAHost; }
  bool producer() const { return producer_; }
  bool released() const { return ref_ == nullptr; }

  // The handle's reference; ValueError once released. Shared so that a call running without
  // the GIL keeps the TensorRef alive if another thread releases the handle meanwhile.
  std::shared_ptr<TensorRef> Ref() const {
    if (!ref_) throw py::value_error("tensor " + Describe() + " was released");
    return ref_;
  }

  void Release() { ref_.reset(); }

  std::string Describe() const {
    return info_.name.empty() ? "#" + std::to_string(info_.tensor_id) : "'" + info_.name + "'";
  }

  py::tuple Device() const {
    return py::make_tuple(info_.device.device_type, info_.device.device_id);
  }

  py::object DLPack(py::object stream, py::object max_version, py::object dl_device,
                    py::object copy) const {
    if (!copy.is_none() && copy.cast<bool>()) {
      throw py::buffer_error("tensord exports zero-copy views only (copy=True refused); "
                             "copy the result instead");
    }
    if (!dl_device.is_none()) {
      auto wanted = dl_device.cast<std::pair<int32_t, int32_t>>();
      if (wanted.first != info_.device.device_type || wanted.second != info_.device.device_id) {
        throw py::buffer_error("tensor " + Describe() + " lives on device (" +
                               std::to_string(info_.device.device_type) + ", " +
                               std::to_string(info_.device.device_id) + "); cannot export to (" +
                               std::to_string(wanted.first) + ", " +
                               std::to_string(wanted.second) + ") without a copy");
      }
    }
    bool versioned = false;
    if (!max_version.is_none()) {
      auto version = max_version.cast<std::pair<uint32_t, uint32_t>>();
      versioned = version.first >= kDLPackMajorVersion;
    }
    std::shared_ptr<TensorRef> ref = Ref();
    // DLPack's stream protocol: the consumer's stream waits for the producer's writes
    // (None: the legacy default stream; -1: the consumer asks for no ordering). Only GPU
    // memory has streams: host tensors and pinned host views ignore `stream`. Level Zero
    // (kDLOneAPI) has no default stream: None waits on the host, an int is the handle of a
    // ze_command_list_handle_t in tensord's context (UseLevelZeroContext).
    const bool level_zero = info_.device.device_type == kDLOneAPI;
    if (info_.device.device_type == kDLCUDA || level_zero) {
      const int64_t none = level_zero ? 0 : static_cast<int64_t>(kLegacyDefaultStream);
      const int64_t wanted = stream.is_none() ? none : stream.cast<int64_t>();
      if (wanted == 0 && !level_zero) {
        throw py::value_error("__dlpack__: stream 0 is ambiguous for CUDA (the DLPack protocol disallows it); "
                              "pass 1 for the legacy default stream or the stream's handle");
      }
      if (wanted != -1) {
        ThrowIfError(WithoutGil([&] { return ref->UseOnStream(static_cast<uintptr_t>(wanted)); }));
      }
    }
    if (versioned) {
      DLManagedTensorVersioned* view = ref->ToDLPackVersioned();
      if (readonly_) view->flags |= kDLFlagBitMaskReadOnly;
      return MakeVersionedCapsule(view);
    }
    if (readonly_) {
      throw py::buffer_error("tensor " + Describe() + " is a read-only mapping, which a legacy "
                             "DLPack capsule cannot signal; pass max_version=(1, 0), use "
                             ".numpy() or .torch(), or get it without " +
                             (pinned() ? "pinned=True" : "readonly=True"));
    }
    return MakeLegacyCapsule(ref->ToDLPack());
  }

  void UseOnStream(uintptr_t stream) const {
    std::shared_ptr<TensorRef> ref = Ref();
    ThrowIfError(WithoutGil([&] { return ref->UseOnStream(stream); }));
  }

  // A legacy capsule for .torch(): elements reinterpreted as `as_dtype` (same size), and a
  // read-only mapping allowed (the caller warns).
  py::object LegacyCapsuleAs(const std::string& as_dtype) const {
    DLDataType dtype = DtypeFromName(as_dtype);
    if (ItemSize(dtype) != ItemSize(info_.dtype)) {
      throw py::type_error("cannot view " + DtypeName(info_.dtype).value_or("?") + " as " +
                           as_dtype + ": different item size");
    }
    DLManagedTensor* view = Ref()->ToDLPack();
    view->dl_tensor.dtype = dtype;
    // A pinned view is host memory, which torch 1.13 refuses under kDLCUDAHost ("Unsupported
    // device_type: 3"): it gets the CPU tensor it is.
    if (pinned()) view->dl_tensor.device = DLDevice{kDLCPU, 0};
    return MakeLegacyCapsule(view);
  }

  py::object NumpyArray() const { return MakeNumpyArray(Ref()->ToDLPack(), readonly_); }

  uintptr_t DataPtr() const {
    return reinterpret_cast<uintptr_t>(Ref()->data());
  }

 private:
  TensorInfo info_;
  bool readonly_;
  bool producer_;
  std::shared_ptr<TensorRef> ref_;  // null once released
};

std::string SecondsText(double s) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), s < 1000 ? "%.3g s" : "%.0f s", s);
  return buf;
}

// What the broker said when the last bounded wait of a WaitLoop ran out, as the caller's
// timeout should read it. Its "within N ms" is the length of that one slice, not the
// caller's timeout, so it goes; so does the whole reason when it only says that nothing
// came ("nothing to acquire"). A batch's reason keeps which element was missing.
std::string SliceReason(std::string message) {
  for (size_t at = message.find(" within "); at != std::string::npos; at = message.find(" within ", at)) {
    size_t end = at + std::strlen(" within ");
    const size_t digits = end;
    while (end < message.size() && message[end] >= '0' && message[end] <= '9') ++end;
    if (end > digits && message.compare(end, 3, " ms") == 0) {
      message.erase(at, end + 3 - at);
    } else {
      at = end;
    }
  }
  if (message.starts_with("nothing to ") && message.find(' ', std::strlen("nothing to ")) == std::string::npos) {
    return "";
  }
  return message;
}

// Runs fn(Wait) as a loop of bounded broker waits with the GIL released, checking for
// signals (Ctrl-C) between them. timeout: nullopt waits forever, <= 0 fails at once.
template <typename T, typename Fn>
T WaitLoop(const std::string& what, std::optional<double> timeout, Fn fn) {
  if (timeout && !(*timeout > 0)) {
    return Unwrap(WithoutGil([&]() -> Result<T> { return fn(Wait::None()); }));
  }
  const Clock::time_point deadline =
      timeout ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(*timeout))
              : Clock::time_point::max();
  for (;;) {
    milliseconds slice = kWaitSlice;
    if (timeout) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      slice = std::clamp(left, milliseconds(1), kWaitSlice);
    }
    Result<T> r = WithoutGil([&]() -> Result<T> { return fn(Wait::For(slice)); });
    if (r.ok()) return std::move(r).value();
    if (r.status().code() != StatusCode::kDeadlineExceeded) throw StatusError(r.status());
    if (timeout && Clock::now() >= deadline) {
      const std::string reason = SliceReason(r.status().message());
      throw StatusError(Status(StatusCode::kDeadlineExceeded, what + " did not arrive within " +
                                                                  SecondsText(*timeout) +
                                                                  (reason.empty() ? "" : ": " + reason)));
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

class PyWatcher {
 public:
  explicit PyWatcher(std::unique_ptr<Watcher> watcher) : watcher_(std::move(watcher)) {}
  ~PyWatcher() {
    if (watcher_) watcher_->Cancel();
  }

  // The next event as a dict; None when `timeout` passes (nullopt: wait forever) or the
  // watch was cancelled (then `done` is set).
  py::object Next(std::optional<double> timeout, bool* done) {
    *done = false;
    std::shared_ptr<Watcher> watcher = watcher_;
    if (!watcher) {
      *done = true;
      return py::none();
    }
    const Clock::time_point deadline =
        timeout ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::max(*timeout, 0.0)))
                : Clock::time_point::max();
    for (;;) {
      milliseconds slice = kWaitSlice;
      if (timeout) {
        auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
        slice = std::clamp(left, milliseconds(0), kWaitSlice);
      }
      Result<std::optional<WatchEvent>> r = WithoutGil([&] { return watcher->Next(slice); });
      if (!r.ok()) {
        if (r.status().code() == StatusCode::kCancelled) {
          *done = true;
          return py::none();
        }
        throw StatusError(r.status());
      }
      if (r.value()) return EventToDict(*r.value());
      if (timeout && Clock::now() >= deadline) return py::none();
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  void Cancel() {
    if (std::shared_ptr<Watcher> watcher = std::move(watcher_)) {
      WithoutGil([&] { watcher->Cancel(); });
    }
  }

 private:
  std::shared_ptr<Watcher> watcher_;  // null once cancelled
};

PublishOptions MakePublishOptions(bool if_absent, std::optional<uint64_t> if_generation,
                                  std::optional<double> ttl, std::optional<uintptr_t> stream = std::nullopt) {
  PublishOptions options;
  // 0 is the CUDA driver's NULL stream, which torch reports for its default stream: the
  // legacy default stream, unless a program was built for per-thread default streams.
  if (stream && *stream != 0) options.stream = *stream;
  if (if_absent && if_generation) {
    throw py::value_error("publish: if_absent and if_generation exclude each other");
  }
  if (if_absent) options.condition = PublishOptions::Condition::kIfAbsent;
  if (if_generation) {
    options.condition = PublishOptions::Condition::kIfGeneration;
    options.generation = *if_generation;
  }
  if (ttl) {
    if (!(*ttl > 0)) throw py::value_error("publish: ttl must be positive seconds");
    options.ttl = milliseconds(std::max<int64_t>(1, static_cast<int64_t>(*ttl * 1000.0)));
  }
  return options;
}

// The namespace of a name: its first segment.
std::string NamespaceOf(const std::string& name) { return name.substr(0, name.find('/')); }

// The handle's reference, for a publish: only a tensor from empty() is published in place.
std::shared_ptr<TensorRef> PublishableRef(const PyTensor& tensor) {
  if (!tensor.producer()) {
    throw py::value_error("publish: tensor " + tensor.Describe() +
                          " was not made by empty(); use put() to publish a copy");
  }
  return tensor.Ref();
}

class PyClient {
 public:
  static std::unique_ptr<PyClient> Connect(std::optional<std::string> socket,
                                           std::optional<std::string> client_name,
                                           bool lease_cache, double lease_cache_linger) {
    ClientOptions options;
    if (socket) options.socket_path = *socket;
    if (client_name) options.client_name = *client_name;
    options.lease_cache = lease_cache;
    options.lease_cache_linger =
        milliseconds(static_cast<int64_t>(std::max(lease_cache_linger, 0.0) * 1000.0));
    std::unique_ptr<Client> client = Unwrap(WithoutGil([&] { return Client::Connect(options); }));
    return std::unique_ptr<PyClient>(new PyClient(std::move(client)));
  }

  ~PyClient() {
    // Stopping the client joins its threads, none of which needs the GIL.
    WithoutGil([&] { client_.reset(); });
  }

  std::unique_ptr<PyTensor> Empty(std::vector<int64_t> shape, const std::string& dtype,
                                  std::optional<std::string> ns, std::pair<int32_t, int32_t> device) {
    TensorSpec spec;
    spec.dtype = DtypeFromName(dtype);
    spec.shape = std::move(shape);
    spec.device = DLDevice{static_cast<DLDeviceType>(device.first), device.second};
    spec.isolated = !ns.has_value();
    std::shared_ptr<Client> client = Core();
    TensorRef ref = Unwrap(WithoutGil([&] { return client->Allocate(ns.value_or(""), spec); }));
    return std::make_unique<PyTensor>(std::move(ref), /*producer=*/true);
  }

  py::dict Publish(PyTensor& tensor, const std::string& name, bool if_absent,
                   std::optional<uint64_t> if_generation, std::optional<double> ttl,
                   std::optional<uintptr_t> stream) {
    PublishOptions options = MakePublishOptions(if_absent, if_generation, ttl, stream);
    std::shared_ptr<TensorRef> ref = PublishableRef(tensor);
    std::shared_ptr<Client> client = Core();
    tensor.set_info(Unwrap(WithoutGil([&] { return client->Publish(*ref, name, options); })));
    return InfoToDict(tensor.info());
  }

  // The handle's description stays as it was: the broker's answer is not waited for.
  void PublishNoWait(PyTensor& tensor, const std::string& name, bool if_absent,
                     std::optional<uint64_t> if_generation, std::optional<double> ttl,
                     std::optional<uintptr_t> stream) {
    PublishOptions options = MakePublishOptions(if_absent, if_generation, ttl, stream);
    std::shared_ptr<TensorRef> ref = PublishableRef(tensor);
    std::shared_ptr<Client> client = Core();
    ThrowIfError(WithoutGil([&] { return client->PublishNoWait(*ref, name, options); }));
  }

  // Allocates, copies `source` in (the one copy) and publishes; the producer's own
  // reference goes when this returns, so the binding is what holds the tensor.
  // A CUDA source is copied device to device on `stream` (the caller's current stream,
  // or the legacy default one) into a broker-owned tensor on the same GPU, and published
  // with a ready event there: no host round trip and no host wait.
  py::dict Put(const std::string& name, Source& source, bool if_absent,
               std::optional<uint64_t> if_generation, std::optional<double> ttl,
               std::optional<std::string> ns, std::optional<uintptr_t> stream) {
    PublishOptions options = MakePublishOptions(if_absent, if_generation, ttl, stream);
    TensorSpec spec;
    spec.dtype = source.dtype();
    spec.shape = source.shape();
    if (source.on_device()) {
      spec.device = source.device();
      if (!source.compact()) {
        throw py::value_error("put: a CUDA source is copied as one block and must be in compact C order; "
                              "pass tensor.contiguous()");
      }
    }
    std::string space = ns.value_or(NamespaceOf(name));
    const uint64_t nbytes = source.nbytes();  // refuses an overflowing shape before anything is allocated
    std::shared_ptr<Client> client = Core();
    Result<TensorInfo> info = WithoutGil([&]() -> Result<TensorInfo> {
      Result<TensorRef> ref = client->Allocate(space, spec);
      if (!ref.ok()) return ref.status();
      if (source.on_device()) {
        if (Status copied = ref->CopyFromDevice(source.data(), nbytes, options.stream); !copied.ok()) return copied;
      } else {
        source.CopyTo(ref->mutable_data());
      }
      return client->Publish(*ref, name, options);
    });
    return InfoToDict(Unwrap(std::move(info)));
  }

  // put() for a batch: every source read first (with the GIL), then one batch of
  // allocations, the copies, and one batch of publishes. The producer's own
  // references go when this returns.
  py::list PutMany(const std::vector<std::pair<std::string, Source*>>& items, bool if_absent,
                   std::optional<uint64_t> if_generation, std::optional<double> ttl,
                   std::optional<std::string> ns) {
    PublishOptions options = MakePublishOptions(if_absent, if_generation, ttl);
    std::vector<AllocateItem> allocations;
    allocations.reserve(items.size());
    for (const auto& [name, source] : items) {
      if (source == nullptr) throw py::type_error("put_many: no array given for '" + name + "'");
      if (source->on_device()) {
        throw py::value_error("put_many: '" + name + "' is CUDA memory; put_many copies host arrays, put() copies a "
                              "CUDA tensor device to device");
      }
      source->nbytes();  // refuses an overflowing shape before anything is allocated
      AllocateItem item;
      item.ns = ns.value_or(NamespaceOf(name));
      item.spec.dtype = source->dtype();
      item.spec.shape = source->shape();
      allocations.push_back(std::move(item));
    }
    std::shared_ptr<Client> client = Core();
    Result<std::vector<TensorInfo>> infos = WithoutGil([&]() -> Result<std::vector<TensorInfo>> {
      Result<std::vector<TensorRef>> refs = client->AllocateMany(allocations);
      if (!refs.ok()) return refs.status();
      std::vector<PublishItem> publish;
      publish.reserve(items.size());
      for (size_t i = 0; i < items.size(); ++i) {
        items[i].second->CopyTo((*refs)[i].mutable_data());
        publish.push_back(PublishItem{&(*refs)[i], items[i].first, options});
      }
      return client->PublishMany(publish);
    });
    py::list out;
    for (const TensorInfo& info : Unwrap(std::move(infos))) out.append(InfoToDict(info));
    return out;
  }

  // get() for a batch of names: one batch per broker wait slice, all or nothing.
  py::list GetMany(const std::vector<std::string>& names, std::optional<double> timeout,
                   std::optional<uint64_t> min_generation, bool readonly, bool pinned) {
    AcquireOptions options;
    options.min_generation = min_generation.value_or(0);
    options.readonly = readonly;
    options.pinned = pinned;
    std::shared_ptr<Client> client = Core();
    const std::string what = "the batch of " + std::to_string(names.size()) + " name" +
                             (names.size() == 1 ? "" : "s");
    std::vector<TensorRef> refs =
        WaitLoop<std::vector<TensorRef>>(what, timeout, [&](Wait wait) {
          AcquireOptions o = options;
          o.wait = wait;
          return client->AcquireMany(names, o);
        });
    py::list out;
    for (TensorRef& ref : refs) {
      out.append(py::cast(std::make_unique<PyTensor>(std::move(ref), /*producer=*/false)));
    }
    return out;
  }

  std::unique_ptr<PyTensor> Get(const std::string& name, std::optional<double> timeout,
                                std::optional<uint64_t> min_generation, bool readonly, bool pinned) {
    AcquireOptions options;
    options.min_generation = min_generation.value_or(0);
    options.readonly = readonly;
    options.pinned = pinned;
    std::shared_ptr<Client> client = Core();
    TensorRef ref = WaitLoop<TensorRef>("'" + name + "'", timeout, [&](Wait wait) {
      AcquireOptions o = options;
      o.wait = wait;
      return client->Acquire(name, o);
    });
    return std::make_unique<PyTensor>(std::move(ref), /*producer=*/false);
  }

  std::unique_ptr<PyTensor> GetById(uint64_t id, bool readonly, bool pinned) {
    AcquireOptions options;
    options.readonly = readonly;
    options.pinned = pinned;
    std::shared_ptr<Client> client = Core();
    TensorRef ref = Unwrap(WithoutGil([&] { return client->Acquire(TensorId{id}, options); }));
    return std::make_unique<PyTensor>(std::move(ref), /*producer=*/false);
  }

  std::unique_ptr<PyTensor> Take(const std::string& name_or_prefix,
                                 std::optional<double> timeout) {
    std::shared_ptr<Client> client = Core();
    TensorRef ref = WaitLoop<TensorRef>("'" + name_or_prefix + "'", timeout, [&](Wait wait) {
      return client->Take(name_or_prefix, wait);
    });
    return std::make_unique<PyTensor>(std::move(ref), /*producer=*/false);
  }

  py::list TakeMany(const std::string& name_or_prefix, size_t max_count, std::optional<double> timeout) {
    std::shared_ptr<Client> client = Core();
    std::vector<TensorRef> refs = WaitLoop<std::vector<TensorRef>>(
        "'" + name_or_prefix + "'", timeout,
        [&](Wait wait) { return client->TakeMany(name_or_prefix, max_count, wait); });
    py::list out;
    for (TensorRef& ref : refs) {
      out.append(py::cast(std::make_unique<PyTensor>(std::move(ref), /*producer=*/false)));
    }
    return out;
  }

  void Delete(const std::string& name, std::optional<uint64_t> if_generation) {
    std::shared_ptr<Client> client = Core();
    ThrowIfError(WithoutGil([&] { return client->Delete(name, if_generation.value_or(0)); }));
  }

  py::list List(const std::string& prefix) {
    std::shared_ptr<Client> client = Core();
    std::vector<TensorInfo> infos = Unwrap(WithoutGil([&] { return client->List(prefix); }));
    py::list out;
    for (const TensorInfo& info : infos) out.append(InfoToDict(info));
    return out;
  }

  py::dict Stat(const std::string& name) {
    std::shared_ptr<Client> client = Core();
    return StatToDict(Unwrap(WithoutGil([&] { return client->Stat(name); })));
  }

  py::dict StatById(uint64_t id) {
    std::shared_ptr<Client> client = Core();
    return StatToDict(Unwrap(WithoutGil([&] { return client->Stat(TensorId{id}); })));
  }

  py::dict BrokerStatusDict() {
    std::shared_ptr<Client> client = Core();
    return StatusToDict(Unwrap(WithoutGil([&] { return client->GetStatus(); })));
  }

  std::unique_ptr<PyWatcher> Watch(const std::string& prefix, bool initial) {
    std::shared_ptr<Client> client = Core();
    return std::make_unique<PyWatcher>(Unwrap(WithoutGil([&] { return client->Watch(prefix, initial); })));
  }

  void Flush() {
    std::shared_ptr<Client> client = Core();
    ThrowIfError(WithoutGil([&] { return client->Flush(); }));
  }

  void Close() {
    std::shared_ptr<Client> client = std::move(client_);
    WithoutGil([&] { client.reset(); });  // the last call in flight, if any, destroys it instead
  }

  bool closed() const { return client_ == nullptr; }
  uint64_t session_id() { return Core()->session_id(); }
  std::string socket_path() { return Core()->socket_path(); }

 private:
  explicit PyClient(std::unique_ptr<Client> client) : client_(std::move(client)) {}

  // Read and written with the GIL held only. Calls copy it so that close() from another
  // thread never destroys a Client in use.
  std::shared_ptr<Client> Core() const {
    if (!client_) throw py::value_error("the tensord client is closed");
    return client_;
  }

  std::shared_ptr<Client> client_;
};

}  // namespace
}  // namespace tensord::python

PYBIND11_MODULE(_tensord, m) {
  using namespace tensord;          // NOLINT: the binding table reads better unqualified
  using namespace tensord::python;  // NOLINT
  namespace py = pybind11;
  m.doc() = "C++ half of the tensord package; use `import tensord`.";
#ifdef NDEBUG
  // Debian's abseil checks every Mutex acquisition (gRPC's included) for lock-order
  // cycles, a debugging aid that costs a global lock per acquisition on the hot path.
  // The interpreter is ours to configure; a C++ application decides this for itself.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  InitGilRelease();
  RegisterErrors(m);
  m.attr("DLPACK_VERSION") = py::make_tuple(kDLPackMajorVersion, kDLPackMinorVersion);
  m.def("default_socket_path", &DefaultClientSocketPath,
        "The socket a client uses when connect() is given none.");
  m.def("_consume_on_native_thread_for_test", &ConsumeOnNativeThreadForTest, py::arg("capsule"));

  py::class_<ArrayView>(m, "_ArrayView");

  py::class_<Source>(m, "_Source")
      .def_static("from_dlpack", &Source::FromDLPack, py::arg("capsule"))
      .def_static("from_buffer", &Source::FromBuffer, py::arg("obj"))
      .def_static("from_array_interface", &Source::FromArrayInterface, py::arg("obj"))
      .def_property_readonly("dtype", [](const Source& s) { return DtypeName(s.dtype()); })
      .def_property_readonly("shape", [](const Source& s) { return py::tuple(py::cast(s.shape())); })
      .def("override_dtype",
           [](Source& s, const std::string& dtype) { s.OverrideDtype(DtypeFromName(dtype)); });

  py::class_<PyTensor>(m, "Tensor", "A tensor held through tensord (see tensord.Tensor).")
      .def("__dlpack__", &PyTensor::DLPack, py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none())
      .def("__dlpack_device__", &PyTensor::Device)
      .def("use_on_stream", &PyTensor::UseOnStream, py::arg("stream"),
           "GPU tensors: makes `stream` (an int handle, e.g. torch's stream.cuda_stream) wait for the "
           "producer's writes, and holds the lease's release until the work queued there is done. "
           "__dlpack__(stream=...) does this for the stream it is given. Nothing for host tensors.")
      .def("_legacy_capsule_as", &PyTensor::LegacyCapsuleAs, py::arg("dtype"))
      .def("_numpy", &PyTensor::NumpyArray)
      .def_property_readonly("_data_ptr", &PyTensor::DataPtr)
      .def("release", &PyTensor::Release,
           "Drops this handle's own reference now; views made from it keep theirs.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyTensor& t, py::args) { t.Release(); })
      .def_property_readonly("shape",
                             [](const PyTensor& t) { return py::tuple(py::cast(t.info().shape)); })
      .def_property_readonly("strides",
                             [](const PyTensor& t) { return py::tuple(py::cast(t.info().strides)); })
      .def_property_readonly("dtype",
                             [](const PyTensor& t) { return DtypeName(t.info().dtype); })
      .def_property_readonly("name",
                             [](const PyTensor& t) -> std::optional<std::string> {
                               if (t.info().name.empty()) return std::nullopt;
                               return t.info().name;
                             })
      .def_property_readonly("tensor_id", [](const PyTensor& t) { return t.info().tensor_id; })
      .def_property_readonly("generation", [](const PyTensor& t) { return t.info().generation; })
      .def_property_readonly("nbytes", [](const PyTensor& t) { return t.info().nbytes; })
      .def_property_readonly("device", &PyTensor::Device)
      .def_property_readonly("readonly", &PyTensor::readonly)
      .def_property_readonly("pinned", &PyTensor::pinned)
      .def_property_readonly("writable", &PyTensor::producer,
                             "True for a tensor from empty(): fill it, then publish it.")
      .def_property_readonly("released", &PyTensor::released)
      .def_property_readonly("info", [](const PyTensor& t) { return InfoToDict(t.info()); })
      .def("__repr__", [](const PyTensor& t) {
        std::string repr = "<tensord.Tensor " + t.Describe() + " " +
                           DtypeName(t.info().dtype).value_or("?") + "[";
        for (size_t i = 0; i < t.info().shape.size(); ++i) {
          if (i > 0) repr += ", ";
          repr += std::to_string(t.info().shape[i]);
        }
        repr += t.released() ? "] released>" : "]>";
        return repr;
      });

  py::class_<PyWatcher>(m, "_Watcher")
      .def("next",
           [](PyWatcher& w, std::optional<double> timeout) {
             bool done = false;
             return w.Next(timeout, &done);
           },
           py::arg("timeout") = py::none())
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__",
           [](PyWatcher& w) {
             bool done = false;
             py::object event = w.Next(std::nullopt, &done);
             if (done) throw py::stop_iteration();
             return event;
           })
      .def("cancel", &PyWatcher::Cancel);

  py::class_<PyClient>(m, "_Client")
      .def_static("connect", &PyClient::Connect, py::arg("socket") = py::none(),
                  py::arg("client_name") = py::none(), py::arg("lease_cache") = true,
                  py::arg("lease_cache_linger") = 2.0)
      .def("empty", &PyClient::Empty, py::arg("shape"), py::arg("dtype"),
           py::arg("ns") = py::none(), py::arg("device") = std::make_pair(int32_t{1}, int32_t{0}))
      .def("publish", &PyClient::Publish, py::arg("tensor"), py::arg("name"),
           py::arg("if_absent") = false, py::arg("if_generation") = py::none(),
           py::arg("ttl") = py::none(), py::arg("stream") = py::none())
      .def("publish_nowait", &PyClient::PublishNoWait, py::arg("tensor"), py::arg("name"),
           py::arg("if_absent") = false, py::arg("if_generation") = py::none(),
           py::arg("ttl") = py::none(), py::arg("stream") = py::none())
      .def("put", &PyClient::Put, py::arg("name"), py::arg("source"), py::arg("if_absent") = false,
           py::arg("if_generation") = py::none(), py::arg("ttl") = py::none(),
           py::arg("ns") = py::none(), py::arg("stream") = py::none())
      .def("put_many", &PyClient::PutMany, py::arg("items"), py::arg("if_absent") = false,
           py::arg("if_generation") = py::none(), py::arg("ttl") = py::none(),
           py::arg("ns") = py::none())
      .def("get", &PyClient::Get, py::arg("name"), py::arg("timeout") = 0.0,
           py::arg("min_generation") = py::none(), py::arg("readonly") = false,
           py::arg("pinned") = false)
      .def("get_many", &PyClient::GetMany, py::arg("names"), py::arg("timeout") = 0.0,
           py::arg("min_generation") = py::none(), py::arg("readonly") = false,
           py::arg("pinned") = false)
      .def("get_by_id", &PyClient::GetById, py::arg("tensor_id"), py::arg("readonly") = false,
           py::arg("pinned") = false)
      .def("take", &PyClient::Take, py::arg("name_or_prefix"), py::arg("timeout") = 0.0)
      .def("take_many", &PyClient::TakeMany, py::arg("name_or_prefix"), py::arg("max_count"),
           py::arg("timeout") = 0.0)
      .def("delete", &PyClient::Delete, py::arg("name"), py::arg("if_generation") = py::none())
      .def("list", &PyClient::List, py::arg("prefix") = "")
      .def("stat", &PyClient::Stat, py::arg("name"))
      .def("stat_by_id", &PyClient::StatById, py::arg("tensor_id"))
      .def("status", &PyClient::BrokerStatusDict)
      .def("watch", &PyClient::Watch, py::arg("prefix") = "", py::arg("initial") = false)
      .def("flush", &PyClient::Flush)
      .def("close", &PyClient::Close)
      .def_property_readonly("closed", &PyClient::closed)
      .def_property_readonly("session_id", &PyClient::session_id)
      .def_property_readonly("socket", &PyClient::socket_path);
}
