// The broker fuzzer's values (fuzz_broker_harness.h): names, prefixes and namespaces, long
// and odd ones among them; extreme integers; known ids of each kind or anything; tensor
// descriptions, valid or not; tags.
#include "tests/fuzz/fuzz_broker_harness.h"

#include <cstdint>
#include <iterator>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

namespace tensord::server::broker_fuzz {

std::string Harness::Name(FuzzedDataProvider& in) {
  static const char* const kNames[] = {"ns/a", "ns/b", "ns/a/b", "shared/x", "shared/y/z",
                                       "team/q", "other/w", "ns", "a"};
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: return in.ConsumeRandomLengthString(64);
    case 1: return "ns/" + std::string(in.ConsumeIntegralInRange<size_t>(250, 520), 'n');
    case 2: {
      static constexpr std::string_view kOdd[] = {
          "", "/", "ns/", "/ns", "ns//a", "ns/./a", "ns/../a", ".", "..", "ns/a\n",
          std::string_view("ns/\0a", 5), "ns/\xff", "ns a"};
      return std::string(in.PickValueInArray(kOdd));
    }
    default: return in.PickValueInArray(kNames);
  }
}

std::string Harness::Prefix(FuzzedDataProvider& in) {
  static const char* const kPrefixes[] = {"", "ns/", "ns", "shared/", "team/", "ns/a", "zz/",
                                          "ns/a/", "/", "ns//"};
  return in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeRandomLengthString(40)
                                                   : in.PickValueInArray(kPrefixes);
}

std::string Harness::Namespace(FuzzedDataProvider& in) {
  static const char* const kNs[] = {"", "ns", "shared", "team", "other", "ns/a", "..", "n s"};
  return in.ConsumeIntegralInRange<int>(0, 9) == 0 ? in.ConsumeRandomLengthString(300)
                                                   : in.PickValueInArray(kNs);
}

uint64_t Harness::Edgy(FuzzedDataProvider& in) {
  static constexpr uint64_t kEdges[] = {0, 1, 2, std::numeric_limits<uint64_t>::max(),
                                        std::numeric_limits<uint64_t>::max() - 1,
                                        uint64_t{1} << 63, uint64_t{1} << 32};
  return in.ConsumeBool() ? in.PickValueInArray(kEdges) : in.ConsumeIntegral<uint64_t>();
}

uint64_t Harness::Pick(FuzzedDataProvider& in, const std::set<uint64_t>& known) {
  if (known.empty() || in.ConsumeIntegralInRange<int>(0, 5) == 0) {
    return in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 40) : Edgy(in);
  }
  auto it = known.begin();
  std::advance(it, in.ConsumeIntegralInRange<size_t>(0, known.size() - 1));
  return *it;
}

std::set<uint64_t> Harness::OpenSessionIds() const {
  std::set<uint64_t> ids;
  for (const auto& [id, session] : sessions_) ids.insert(id);
  return ids;
}

std::set<uint64_t> Harness::KnownLeases() {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<uint64_t> ids;
  for (const auto& [lease, owner] : leases_) ids.insert(lease);
  return ids;
}

v1::TensorDesc Harness::Desc(FuzzedDataProvider& in) {
  v1::TensorDesc desc;
  bool plain = in.ConsumeIntegralInRange<int>(0, 4) != 0;
  desc.mutable_dtype()->set_code(plain ? v1::DTYPE_CODE_FLOAT
                                       : static_cast<v1::DTypeCode>(in.ConsumeIntegralInRange<int>(0, 8)));
  static constexpr uint32_t kBits[] = {8, 16, 32, 64, 128, 0, 7};
  desc.mutable_dtype()->set_bits(plain ? 32 : in.PickValueInArray(kBits));
  desc.mutable_dtype()->set_lanes(plain || in.ConsumeBool() ? 1 : in.ConsumeIntegral<uint32_t>());
  int ndim = in.ConsumeIntegralInRange<int>(0, plain ? 3 : 34);
  for (int i = 0; i < ndim; ++i) {
    desc.add_shape(in.ConsumeIntegralInRange<int>(0, 7) == 0
                       ? static_cast<int64_t>(Edgy(in))
                       : in.ConsumeIntegralInRange<int64_t>(0, 300));
  }
  if (!plain && in.ConsumeBool()) {
    for (int i = 0; i < ndim; ++i) desc.add_strides(static_cast<int64_t>(Edgy(in) % 4096));
  }
  if (!plain && in.ConsumeBool()) desc.set_byte_offset(Edgy(in) % (2 * kQuota));
  bool cpu = plain || in.ConsumeBool();
  desc.mutable_device()->set_type(cpu ? v1::DEVICE_TYPE_CPU
                                      : static_cast<v1::DeviceType>(in.ConsumeIntegralInRange<int>(0, 15)));
  if (!cpu) desc.mutable_device()->set_index(in.ConsumeIntegral<int32_t>());
  return desc;
}

void Harness::Tags(FuzzedDataProvider& in, google::protobuf::Map<std::string, std::string>* tags) {
  int count = in.ConsumeIntegralInRange<int>(0, 9) == 0 ? 65 : in.ConsumeIntegralInRange<int>(0, 2);
  for (int i = 0; i < count; ++i) {
    std::string key = in.ConsumeBool() ? "k" + std::to_string(i)
                                       : std::string(in.ConsumeIntegralInRange<size_t>(0, 300), 'k');
    (*tags)[key] = std::string(in.ConsumeIntegralInRange<size_t>(0, 5000), 'v');
  }
}

}  // namespace tensord::server::broker_fuzz
