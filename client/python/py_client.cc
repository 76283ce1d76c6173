#include "py_client.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include "py_convert.h"
#include "py_errors.h"
#include "py_gil.h"
#include "py_source.h"
#include "py_tensor.h"
#include "tensord/client.h"

namespace tensord::python {
namespace {

namespace py = pybind11;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// While a blocking call waits at the broker, how often the thread that handles signals
// wakes to run their handlers (the bound on how late Ctrl-C is noticed). It sends nothing.
constexpr milliseconds kSignalCheck{100};
// The broker cuts any wait to this (common::kMaxDurationMs, about 49 days); a longer
// timeout is as good as forever.
constexpr double kLongestWaitSeconds = 4294967.0;
// How long one local wait of a watcher's next() lasts (a watch's events come on its own
// stream: these waits send nothing); the bound on how late Ctrl-C is noticed there.
constexpr milliseconds kWatchSlice{150};

// A timeout as the timeout errors write it: "0.5 s", "3 s", "120 s".
std::string SecondsText(double s) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), s < 1000 ? "%.3g s" : "%.0f s", s);
  return buf;
}

// Runs fn(Wait, const CancelToken*) with the GIL released, as ONE broker wait of the whole
// timeout (nullopt: forever; <= 0: none, failing at once). On the thread that handles
// signals the wait is cancellable: every kSignalCheck it runs the signal handlers, and one
// that raises (KeyboardInterrupt) cancels the wait at the broker, whose exception is then
// thrown here. `token`, when given, cancels it too (asyncio: a cancelled task). The timeout
// error names `what` and the caller's timeout; `detail` adds the client's own message (a
// batch's, which names the element).
template <typename T, typename Fn>
T BlockingWait(const std::string& what, std::optional<double> timeout, Fn fn, bool detail = false,
               const CancelToken* token = nullptr) {
  if (timeout && !(*timeout > 0)) {
    return Unwrap(WithoutGil([&]() -> Result<T> { return fn(Wait::None(), token); }));
  }
  Wait wait = Wait::Forever();
  if (timeout && *timeout < kLongestWaitSeconds) {
    wait = Wait::For(milliseconds(std::max<int64_t>(1, static_cast<int64_t>(std::ceil(*timeout * 1000.0)))));
  }
  std::optional<CancelToken> signals;
  if (token == nullptr && HandlesSignals()) {
    token = &signals.emplace([] { return SignalHandlerRaised(); }, kSignalCheck);
  }
  Result<T> r = WithoutGil([&]() -> Result<T> { return fn(wait, token); });
  if (PyErr_Occurred() != nullptr) throw py::error_already_set();
  if (r.ok()) return std::move(r).value();
  if (r.status().code() == StatusCode::kDeadlineExceeded && timeout) {
    std::string message = what + " did not arrive within " + SecondsText(*timeout);
    if (detail) message += ": " + r.status().message();
    throw StatusError(Status(StatusCode::kDeadlineExceeded, message));
  }
  throw StatusError(r.status());
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
      milliseconds slice = kWatchSlice;
      if (timeout) {
        auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
        slice = std::clamp(left, milliseconds(0), kWatchSlice);
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

using Tags = std::map<std::string, std::string>;

PublishOptions MakePublishOptions(bool if_absent, std::optional<uint64_t> if_generation,
                                  std::optional<double> ttl, std::optional<uintptr_t> stream,
                                  std::optional<Tags> tags, bool unbind_on_exit = false) {
  PublishOptions options;
  options.unbind_on_exit = unbind_on_exit;
  if (tags) options.tags = *std::move(tags);
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

// What empty() allocates: `shape` of `dtype` on `device`, with `tags`.
TensorSpec EmptySpec(std::vector<int64_t> shape, const std::string& dtype, std::pair<int32_t, int32_t> device,
                     std::optional<Tags> tags) {
  TensorSpec spec;
  if (tags) spec.tags = *std::move(tags);
  spec.dtype = DtypeFromName(dtype);
  spec.shape = std::move(shape);
  spec.device = DLDevice{static_cast<DLDeviceType>(device.first), device.second};
  return spec;
}

// What put() allocates for `source`: its dtype and shape, on its device when it is device
// memory (copied as one block, so it must be compact). Refuses an overflowing shape before
// anything is allocated.
TensorSpec PutSpec(Source& source, const std::string& what) {
  TensorSpec spec;
  spec.dtype = source.dtype();
  spec.shape = source.shape();
  if (source.on_device()) {
    spec.device = source.device();
    if (!source.compact()) {
      throw py::value_error(what + ": a CUDA source is copied as one block and must be in compact C order; "
                            "pass tensor.contiguous()");
    }
  }
  source.nbytes();
  return spec;
}

// put()'s one copy of `source` into `ref` (without the GIL): device to device on `stream`
// for device memory.
Status CopyIn(Source& source, TensorRef& ref, uintptr_t stream) {
  if (source.on_device()) return ref.CopyFromDevice(source.data(), source.nbytes(), stream);
  source.CopyTo(ref.mutable_data());
  return Status();
}

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
                                           bool lease_cache, double lease_cache_linger,
                                           std::vector<uint32_t> trusted_daemon_uids,
                                           bool allocate_ahead) {
    ClientOptions options;
    options.allocate_ahead = allocate_ahead;
    if (socket) options.socket_path = *socket;
    options.trusted_daemon_uids = std::move(trusted_daemon_uids);
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

  // Without `ns` a tensor gets a dedicated buffer; a host one goes in the namespace this
  // client last published a plain tensor into (plain_ns_), so that a producer that keeps
  // publishing into one namespace gets recycled buffers as with ns= (buffers recycle only
  // within a namespace, so no reader of one namespace sees another's bytes); Publish copies
  // it when it is published elsewhere after all.
  std::unique_ptr<PyTensor> Empty(std::vector<int64_t> shape, const std::string& dtype,
                                  std::optional<std::string> ns, std::pair<int32_t, int32_t> device,
                                  std::optional<Tags> tags) {
    TensorSpec spec = EmptySpec(std::move(shape), dtype, device, std::move(tags));
    std::optional<std::string> plain;
    if (!ns) {
      plain = spec.device.device_type == kDLCPU ? plain_ns_ : std::string();
      spec.isolated = true;  // a buffer of its own (no arena neighbours), recycled within `plain`
    }
    const std::string space = ns ? *ns : *plain;
    std::shared_ptr<Client> client = Core();
    TensorRef ref = Unwrap(WithoutGil([&] { return client->Allocate(space, spec); }));
    auto tensor = std::make_unique<PyTensor>(std::move(ref), /*producer=*/true, client);
    if (plain) tensor->set_plain_ns(*std::move(plain));
    return tensor;
  }

  py::dict Publish(PyTensor& tensor, const std::string& name, bool if_absent,
                   std::optional<uint64_t> if_generation, std::optional<double> ttl,
                   std::optional<uintptr_t> stream, std::optional<Tags> tags, bool unbind_on_exit) {
    PublishOptions options =
        MakePublishOptions(if_absent, if_generation, ttl, stream, std::move(tags), unbind_on_exit);
    std::shared_ptr<TensorRef> ref = PlainPublishable(tensor, name);
    std::shared_ptr<Client> client = Core();
    tensor.set_info(Unwrap(WithoutGil([&] { return client->Publish(*ref, name, options); })));
    NotePlainPublish(tensor, name);
    return InfoToDict(tensor.info());
  }

  // Publishes under the work queue `prefix` with a name of its own (QueueItemName); with
  // `wait` false as PublishNoWait (None returned).
  py::object PublishInQueue(PyTensor& tensor, const std::string& prefix, std::optional<double> ttl,
                            std::optional<uintptr_t> stream, std::optional<Tags> tags, bool wait,
                            bool unbind_on_exit) {
    PublishOptions options = MakePublishOptions(false, std::nullopt, ttl, stream, std::move(tags), unbind_on_exit);
    std::shared_ptr<TensorRef> ref = PublishableRef(tensor);
    if (tensor.queue() != prefix) {
      // Only a tensor of the queue's own empty() holds one of its slots.
      throw py::value_error("publish: tensor " + tensor.Describe() + " was not made by the empty() of queue '" +
                            prefix + "'; use the queue's put() to publish a copy");
    }
    const std::string name = QueueItemName(prefix, *ref);
    std::shared_ptr<Client> client = Core();
    if (!wait) {
      ThrowIfError(WithoutGil([&] { return client->PublishNoWait(*ref, name, options); }));
      return py::none();
    }
    tensor.set_info(Unwrap(WithoutGil([&] { return client->Publish(*ref, name, options); })));
    return InfoToDict(tensor.info());
  }

  // The handle's description stays as it was: the broker's answer is not waited for.
  void PublishNoWait(PyTensor& tensor, const std::string& name, bool if_absent,
                     std::optional<uint64_t> if_generation, std::optional<double> ttl,
                     std::optional<uintptr_t> stream, std::optional<Tags> tags, bool unbind_on_exit) {
    PublishOptions options =
        MakePublishOptions(if_absent, if_generation, ttl, stream, std::move(tags), unbind_on_exit);
    std::shared_ptr<TensorRef> ref = PlainPublishable(tensor, name);
    std::shared_ptr<Client> client = Core();
    ThrowIfError(WithoutGil([&] { return client->PublishNoWait(*ref, name, options); }));
    NotePlainPublish(tensor, name);
  }

  // Allocates, copies `source` in (the one copy) and publishes; the producer's own
  // reference goes when this returns, so the binding is what holds the tensor.
  // A CUDA source is copied device to device on `stream` (the caller's current stream,
  // or the legacy default one) into a broker-owned tensor on the same GPU, and published
  // with a ready event there: no host round trip and no host wait.
  py::dict Put(const std::string& name, Source& source, bool if_absent,
               std::optional<uint64_t> if_generation, std::optional<double> ttl,
               std::optional<std::string> ns, std::optional<uintptr_t> stream, std::optional<Tags> tags) {
    PublishOptions options = MakePublishOptions(if_absent, if_generation, ttl, stream, std::move(tags));
    const TensorSpec spec = PutSpec(source, "put");
    std::string space = ns.value_or(NamespaceOf(name));
    std::shared_ptr<Client> client = Core();
    Result<TensorInfo> info = WithoutGil([&]() -> Result<TensorInfo> {
      Result<TensorRef> ref = client->Allocate(space, spec);
      if (!ref.ok()) return ref.status();
      if (Status copied = CopyIn(source, *ref, options.stream); !copied.ok()) return copied;
      return client->Publish(*ref, name, options);
    });
    return InfoToDict(Unwrap(std::move(info)));
  }

  // A writable tensor in a slot of the bounded work queue `prefix`, waiting for one as
  // take() waits for a tensor (timeout None: forever; Ctrl-C interrupts).
  std::unique_ptr<PyTensor> EmptyInQueue(const std::string& prefix, uint32_t depth, std::vector<int64_t> shape,
                                         const std::string& dtype, std::pair<int32_t, int32_t> device,
                                         std::optional<Tags> tags, std::optional<double> timeout,
                                         const CancelToken* cancel) {
    const TensorSpec spec = EmptySpec(std::move(shape), dtype, device, std::move(tags));
    std::shared_ptr<Client> client = Core();
    TensorRef ref = WaitForSlot(*client, prefix, depth, spec, timeout, cancel);
    auto tensor = std::make_unique<PyTensor>(std::move(ref), /*producer=*/true, client);
    tensor->set_queue(prefix);
    return tensor;
  }

  // put() into the bounded work queue `prefix`: a slot (waited for as EmptyInQueue waits),
  // the copy, and the publish under QueueItemName.
  py::dict PutInQueue(const std::string& prefix, uint32_t depth, Source& source, std::optional<double> ttl,
                      std::optional<uintptr_t> stream, std::optional<Tags> tags, std::optional<double> timeout,
                      const CancelToken* cancel, bool unbind_on_exit) {
    PublishOptions options = MakePublishOptions(false, std::nullopt, ttl, stream, std::move(tags), unbind_on_exit);
    const TensorSpec spec = PutSpec(source, "put");
    std::shared_ptr<Client> client = Core();
    TensorRef ref = WaitForSlot(*client, prefix, depth, spec, timeout, cancel);
    Result<TensorInfo> info = WithoutGil([&]() -> Result<TensorInfo> {
      if (Status copied = CopyIn(source, ref, options.stream); !copied.ok()) return copied;
      return client->Publish(ref, QueueItemName(prefix, ref), options);
    });
    return InfoToDict(Unwrap(std::move(info)));
  }

  // put() for a batch: every source read first (with the GIL), then one batch of
  // allocations, the copies, and one batch of publishes. The producer's own
  // references go when this returns.
  py::list PutMany(const std::vector<std::pair<std::string, Source*>>& items, bool if_absent,
                   std::optional<uint64_t> if_generation, std::optional<double> ttl,
                   std::optional<std::string> ns, std::optional<Tags> tags) {
    PublishOptions options = MakePublishOptions(if_absent, if_generation, ttl, std::nullopt, std::move(tags));
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

  // get() for a batch of names: one batch, all or nothing, waiting as one.
  py::list GetMany(const std::vector<std::string>& names, std::optional<double> timeout,
                   std::optional<uint64_t> min_generation, bool readonly, bool pinned,
                   const CancelToken* cancel) {
    AcquireOptions options;
    options.min_generation = min_generation.value_or(0);
    options.readonly = readonly;
    options.pinned = pinned;
    std::shared_ptr<Client> client = Core();
    const std::string what = "the batch of " + std::to_string(names.size()) + " name" +
                             (names.size() == 1 ? "" : "s");
    std::vector<TensorRef> refs = BlockingWait<std::vector<TensorRef>>(
        what, timeout,
        [&](Wait wait, const CancelToken* token) {
          AcquireOptions o = options;
          o.wait = wait;
          o.cancel = token;
          return client->AcquireMany(names, o);
        },
        /*detail=*/true, cancel);
    py::list out;
    for (TensorRef& ref : refs) {
      out.append(py::cast(std::make_unique<PyTensor>(std::move(ref), /*producer=*/false, client)));
    }
    return out;
  }

  std::unique_ptr<PyTensor> Get(const std::string& name, std::optional<double> timeout,
                                std::optional<uint64_t> min_generation, bool readonly, bool pinned,
                                const CancelToken* cancel) {
    AcquireOptions options;
    options.min_generation = min_generation.value_or(0);
    options.readonly = readonly;
    options.pinned = pinned;
    std::shared_ptr<Client> client = Core();
    TensorRef ref = BlockingWait<TensorRef>(
        "'" + name + "'", timeout,
        [&](Wait wait, const CancelToken* token) {
          AcquireOptions o = options;
          o.wait = wait;
          o.cancel = token;
          return client->Acquire(name, o);
        },
        /*detail=*/false, cancel);
    return std::make_unique<PyTensor>(std::move(ref), /*producer=*/false, client);
  }

  std::unique_ptr<PyTensor> GetById(uint64_t id, bool readonly, bool pinned) {
    AcquireOptions options;
    options.readonly = readonly;
    options.pinned = pinned;
    std::shared_ptr<Client> client = Core();
    TensorRef ref = Unwrap(WithoutGil([&] { return client->Acquire(TensorId{id}, options); }));
    return std::make_unique<PyTensor>(std::move(ref), /*producer=*/false, client);
  }

  std::unique_ptr<PyTensor> Take(const std::string& name_or_prefix, std::optional<double> timeout,
                                 bool pinned, bool readonly, const CancelToken* cancel) {
    std::shared_ptr<Client> client = Core();
    TensorRef ref = BlockingWait<TensorRef>(
        "'" + name_or_prefix + "'", timeout,
        [&](Wait wait, const CancelToken* token) {
          return client->Take(name_or_prefix,
                              TakeOptions{.wait = wait, .cancel = token, .pinned = pinned, .readonly = readonly});
        },
        /*detail=*/false, cancel);
    return std::make_unique<PyTensor>(std::move(ref), /*producer=*/false, client);
  }

  py::list TakeMany(const std::string& name_or_prefix, size_t max_count, std::optional<double> timeout,
                    bool pinned, bool readonly, const CancelToken* cancel) {
    std::shared_ptr<Client> client = Core();
    std::vector<TensorRef> refs = BlockingWait<std::vector<TensorRef>>(
        "'" + name_or_prefix + "'", timeout,
        [&](Wait wait, const CancelToken* token) {
          return client->TakeMany(name_or_prefix, max_count,
                                  TakeOptions{.wait = wait, .cancel = token, .pinned = pinned, .readonly = readonly});
        },
        /*detail=*/false, cancel);
    py::list out;
    for (TensorRef& ref : refs) {
      out.append(py::cast(std::make_unique<PyTensor>(std::move(ref), /*producer=*/false, client)));
    }
    return out;
  }

  std::string HandOver(const PyTensor& tensor, std::optional<double> ttl) {
    return tensor.HandOver(ttl)[0].cast<std::string>();
  }

  std::unique_ptr<PyTensor> Redeem(const std::string& token, bool readonly, bool pinned) {
    AcquireOptions options;
    options.readonly = readonly;
    options.pinned = pinned;
    std::shared_ptr<Client> client = Core();
    TensorRef ref = Unwrap(WithoutGil([&] { return client->Redeem(token, options); }));
    return std::make_unique<PyTensor>(std::move(ref), /*producer=*/false, client);
  }

  uint64_t CancelHandOvers(std::optional<std::vector<std::string>> tokens) {
    std::shared_ptr<Client> client = Core();
    const std::vector<std::string> given = tokens.value_or(std::vector<std::string>());
    // An empty list names no token; only None cancels every one.
    if (tokens && given.empty()) return 0;
    return Unwrap(WithoutGil([&] { return client->CancelHandOvers(given); })).cancelled;
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

  // (descriptions, next_page_token): one page of List.
  py::tuple ListPage(const std::string& prefix, const std::string& page_token, size_t limit) {
    std::shared_ptr<Client> client = Core();
    ListPageOptions options;
    options.page_token = page_token;
    options.limit = limit;
    TensorPage page = Unwrap(WithoutGil([&] { return client->ListPage(prefix, options); }));
    py::list out;
    for (const TensorInfo& info : page.tensors) out.append(InfoToDict(info));
    return py::make_tuple(std::move(out), page.next_page_token);
  }

  py::dict Stat(const std::string& name) {
    std::shared_ptr<Client> client = Core();
    return StatToDict(Unwrap(WithoutGil([&] { return client->Stat(name); })));
  }

  py::dict StatById(uint64_t id) {
    std::shared_ptr<Client> client = Core();
    return StatToDict(Unwrap(WithoutGil([&] { return client->Stat(TensorId{id}); })));
  }

  py::dict BrokerStatusDict(bool sessions, bool queues) {
    std::shared_ptr<Client> client = Core();
    StatusOptions options;
    options.sessions = sessions;
    options.queues = queues;
    return StatusToDict(Unwrap(WithoutGil([&] { return client->GetStatus(options); })), sessions, queues);
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

  // A tensor of `spec` in a slot of the queue `prefix`, the wait for it as take()'s.
  static TensorRef WaitForSlot(Client& client, const std::string& prefix, uint32_t depth, const TensorSpec& spec,
                               std::optional<double> timeout, const CancelToken* cancel) {
    return BlockingWait<TensorRef>(
        "room in queue '" + prefix + "'", timeout,
        [&](Wait wait, const CancelToken* token) {
          return client.AllocateInQueue(prefix, spec, QueueSlotOptions{.depth = depth, .wait = wait, .cancel = token});
        },
        /*detail=*/false, cancel);
  }

  // The handle's reference for publishing under `name`. A plain empty() placed in the
  // namespace its client publishes into, published into another one after all, cannot go
  // there (a buffer stays in its namespace): its bytes are copied once into a dedicated
  // tensor, which the handle then refers to and which is published instead.
  std::shared_ptr<TensorRef> PlainPublishable(PyTensor& tensor, const std::string& name) {
    std::shared_ptr<TensorRef> ref = PublishableRef(tensor);
    const std::optional<std::string>& plain = tensor.plain_ns();
    if (!plain || plain->empty() || name.empty() || NamespaceOf(name) == *plain) return ref;
    const TensorInfo& info = tensor.info();
    TensorSpec spec;
    spec.dtype = info.dtype;
    spec.shape = info.shape;
    spec.device = info.device;
    spec.isolated = true;
    spec.tags = info.tags;
    std::shared_ptr<Client> client = Core();
    TensorRef copy = Unwrap(WithoutGil([&]() -> Result<TensorRef> {
      Result<TensorRef> fresh = client->Allocate("", spec);
      if (fresh.ok() && info.nbytes > 0) std::memcpy(fresh->mutable_data(), ref->data(), info.nbytes);
      return fresh;
    }));
    tensor.Replace(std::move(copy));
    tensor.set_plain_ns("");
    return tensor.Ref();
  }

  // After a plain tensor was published under `name`: this client's next plain host
  // tensors go in that name's namespace.
  void NotePlainPublish(const PyTensor& tensor, const std::string& name) {
    if (tensor.plain_ns() && !name.empty()) plain_ns_ = NamespaceOf(name);
  }

  std::shared_ptr<Client> client_;
  // Where this client last published a plain (no ns=) tensor: its next plain host tensors
  // are allocated there. Read and written with the GIL held.
  std::string plain_ns_;
};

}  // namespace

void BindWatcher(py::module_& m) {
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
}

void BindClient(py::module_& m) {
  // A wait's cancellation, for asyncio: cancel() from any thread ends the calls given it.
  py::class_<CancelToken>(m, "_CancelToken")
      .def(py::init<>())
      .def("cancel", [](CancelToken& token) { WithoutGil([&] { token.Cancel(); }); })
      .def_property_readonly("cancelled", &CancelToken::cancelled);
  py::class_<PyClient>(m, "_Client")
      .def_static("connect", &PyClient::Connect, py::arg("socket") = py::none(),
                  py::arg("client_name") = py::none(), py::arg("lease_cache") = true,
                  py::arg("lease_cache_linger") = 2.0, py::arg("trusted_daemon_uids") = std::vector<uint32_t>{},
                  py::arg("allocate_ahead") = false)
      .def("empty", &PyClient::Empty, py::arg("shape"), py::arg("dtype"),
           py::arg("ns") = py::none(), py::arg("device") = std::make_pair(int32_t{1}, int32_t{0}),
           py::arg("tags") = py::none())
      .def("publish", &PyClient::Publish, py::arg("tensor"), py::arg("name"),
           py::arg("if_absent") = false, py::arg("if_generation") = py::none(),
           py::arg("ttl") = py::none(), py::arg("stream") = py::none(), py::arg("tags") = py::none(),
           py::arg("unbind_on_exit") = false)
      .def("publish_nowait", &PyClient::PublishNoWait, py::arg("tensor"), py::arg("name"),
           py::arg("if_absent") = false, py::arg("if_generation") = py::none(),
           py::arg("ttl") = py::none(), py::arg("stream") = py::none(), py::arg("tags") = py::none(),
           py::arg("unbind_on_exit") = false)
      .def("put", &PyClient::Put, py::arg("name"), py::arg("source"), py::arg("if_absent") = false,
           py::arg("if_generation") = py::none(), py::arg("ttl") = py::none(),
           py::arg("ns") = py::none(), py::arg("stream") = py::none(), py::arg("tags") = py::none())
      .def("empty_in_queue", &PyClient::EmptyInQueue, py::arg("prefix"), py::arg("depth"), py::arg("shape"),
           py::arg("dtype"), py::arg("device") = std::make_pair(int32_t{1}, int32_t{0}),
           py::arg("tags") = py::none(), py::arg("timeout") = py::none(), py::arg("cancel") = py::none())
      .def("publish_in_queue", &PyClient::PublishInQueue, py::arg("tensor"), py::arg("prefix"),
           py::arg("ttl") = py::none(), py::arg("stream") = py::none(), py::arg("tags") = py::none(),
           py::arg("wait") = true, py::arg("unbind_on_exit") = false)
      .def("put_in_queue", &PyClient::PutInQueue, py::arg("prefix"), py::arg("depth"), py::arg("source"),
           py::arg("ttl") = py::none(), py::arg("stream") = py::none(), py::arg("tags") = py::none(),
           py::arg("timeout") = py::none(), py::arg("cancel") = py::none(), py::arg("unbind_on_exit") = false)
      .def("put_many", &PyClient::PutMany, py::arg("items"), py::arg("if_absent") = false,
           py::arg("if_generation") = py::none(), py::arg("ttl") = py::none(),
           py::arg("ns") = py::none(), py::arg("tags") = py::none())
      .def("get", &PyClient::Get, py::arg("name"), py::arg("timeout") = 0.0,
           py::arg("min_generation") = py::none(), py::arg("readonly") = false,
           py::arg("pinned") = false, py::arg("cancel") = py::none())
      .def("get_many", &PyClient::GetMany, py::arg("names"), py::arg("timeout") = 0.0,
           py::arg("min_generation") = py::none(), py::arg("readonly") = false,
           py::arg("pinned") = false, py::arg("cancel") = py::none())
      .def("get_by_id", &PyClient::GetById, py::arg("tensor_id"), py::arg("readonly") = false,
           py::arg("pinned") = false)
      .def("take", &PyClient::Take, py::arg("name_or_prefix"), py::arg("timeout") = 0.0,
           py::arg("pinned") = false, py::arg("readonly") = false, py::arg("cancel") = py::none())
      .def("take_many", &PyClient::TakeMany, py::arg("name_or_prefix"), py::arg("max_count"),
           py::arg("timeout") = 0.0, py::arg("pinned") = false, py::arg("readonly") = false,
           py::arg("cancel") = py::none())
      .def("hand_over", &PyClient::HandOver, py::arg("tensor"), py::arg("ttl") = py::none())
      .def("cancel_hand_overs", &PyClient::CancelHandOvers, py::arg("tokens") = py::none())
      .def("redeem", &PyClient::Redeem, py::arg("token"), py::arg("readonly") = false, py::arg("pinned") = false)
      .def("delete", &PyClient::Delete, py::arg("name"), py::arg("if_generation") = py::none())
      .def("list", &PyClient::List, py::arg("prefix") = "")
      .def("list_page", &PyClient::ListPage, py::arg("prefix") = "", py::arg("page_token") = "",
           py::arg("limit") = 0)
      .def("stat", &PyClient::Stat, py::arg("name"))
      .def("stat_by_id", &PyClient::StatById, py::arg("tensor_id"))
      .def("status", &PyClient::BrokerStatusDict, py::arg("sessions") = false, py::arg("queues") = false)
      .def("watch", &PyClient::Watch, py::arg("prefix") = "", py::arg("initial") = false)
      .def("flush", &PyClient::Flush)
      .def("close", &PyClient::Close)
      .def_property_readonly("closed", &PyClient::closed)
      .def_property_readonly("session_id", &PyClient::session_id)
      .def_property_readonly("socket", &PyClient::socket_path);
}

}  // namespace tensord::python
