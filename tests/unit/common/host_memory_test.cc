// The host memory kind on both sides of the seam: HostBackend (broker) and HostImporter
// (client), and the Importers table.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "common/memory/backends.h"
#include "common/memory/host/host_backend.h"
#include "common/memory/host/host_importer.h"
#include "common/memory/host/memfd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::common {
namespace {

namespace v1 = tensord::v1;
using ::tensord::common::testing::IsOk;
using ::tensord::common::testing::StatusIs;
using ::testing::HasSubstr;

BackendDevice Host() { return HostBackend().devices().front(); }

ino_t Inode(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

FetchedBuffer Fetched(const BackendBuffer& buffer, uint64_t id = 1) {
  absl::StatusOr<MemoryHandle> handle = buffer.Export();
  EXPECT_THAT(handle, IsOk());
  FetchedBuffer fetched;
  fetched.buffer_id = id;
  fetched.size = buffer.size();
  fetched.handle = *std::move(handle);
  return fetched;
}

TEST(HostBackendTest, OneDeviceOfWholePages) {
  HostBackend backend;
  EXPECT_EQ(backend.name(), "host");
  EXPECT_EQ(backend.device_type(), v1::DEVICE_TYPE_CPU);
  EXPECT_EQ(backend.unavailable_reason(), "");
  std::vector<BackendDevice> devices = backend.devices();
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].device.type(), v1::DEVICE_TYPE_CPU);
  EXPECT_TRUE(devices[0].device.uuid().empty());
  EXPECT_GT(devices[0].total_bytes, 0u);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(backend.RoundUp(devices[0], 1), page);
  EXPECT_EQ(backend.RoundUp(devices[0], page), page);
  EXPECT_EQ(backend.RoundUp(devices[0], page + 1), 2 * page);
}

// Pages of [data, data + bytes) this process has mapped now (present in its page table).
size_t PresentPages(const uint8_t* data, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  size_t present = 0;
  for (uint64_t off = 0; off < bytes; off += page) {
    uint64_t entry = 0;
    const off_t at = static_cast<off_t>((reinterpret_cast<uintptr_t>(data) + off) / page * sizeof(entry));
    EXPECT_EQ(::pread(fd, &entry, sizeof(entry), at), static_cast<ssize_t>(sizeof(entry)));
    if ((entry >> 63) & 1) ++present;
  }
  ::close(fd);
  return present;
}

TEST(HostImporterTest, APopulatedProducerMappingHasEveryPageMappedAndAReaderNone) {
  HostBackend backend;
  constexpr uint64_t kPages = 64;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  auto buffer = backend.Allocate(Host(), kPages * page, "populate");
  ASSERT_THAT(buffer, IsOk());
  FetchedBuffer producer = Fetched(**buffer);
  producer.populate = true;
  auto writable = HostImporter().Import(producer, MapMode::kSharedWritable, "buffer 1");
  ASSERT_THAT(writable, IsOk());
  EXPECT_EQ(PresentPages((*writable)->data(), kPages * page), kPages);
  // A reader's copy-on-write mapping is never populated: that would copy every page.
  FetchedBuffer reader = Fetched(**buffer);
  reader.populate = true;
  auto cow = HostImporter().Import(reader, MapMode::kPrivate, "buffer 1");
  ASSERT_THAT(cow, IsOk());
  EXPECT_EQ(PresentPages((*cow)->data(), kPages * page), 0u);
}

// A reader that only read keeps its page table (no discard, no refault next time); one
// written page is found and dropped, in a large range too.
TEST(HostImporterTest, DiscardDropsOnlyWhatAReaderWrote) {
  HostBackend backend;
  constexpr uint64_t kPages = 2048;  // 8 MiB with 4 KiB pages: the scan covers many entries
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  auto buffer = backend.Allocate(Host(), kPages * page, "discard");
  ASSERT_THAT(buffer, IsOk());
  auto writer = HostImporter().Import(Fetched(**buffer), MapMode::kSharedWritable, "buffer 1");
  ASSERT_THAT(writer, IsOk());
  std::memset((*writer)->data(), 7, kPages * page);
  auto reader = HostImporter().Import(Fetched(**buffer), MapMode::kPrivate, "buffer 1");
  ASSERT_THAT(reader, IsOk());
  uint64_t sum = 0;
  for (uint64_t k = 0; k < kPages; ++k) sum += (*reader)->data()[k * page];
  EXPECT_EQ(sum, 7 * kPages);
  const size_t mapped = PresentPages((*reader)->data(), kPages * page);
  EXPECT_GT(mapped, 0u);
  ASSERT_THAT((*reader)->DiscardPrivatePages(0, kPages * page), IsOk());
  EXPECT_EQ(PresentPages((*reader)->data(), kPages * page), mapped);
  (*reader)->data()[(kPages - 1) * page + 5] = 1;
  ASSERT_THAT((*reader)->DiscardPrivatePages(0, kPages * page), IsOk());
  EXPECT_EQ((*reader)->data()[(kPages - 1) * page + 5], 7);
}

TEST(HostBackendTest, AllocatesSealedBuffersAndExportsADupOfTheMemfd) {
  HostBackend backend;
  auto buffer = backend.Allocate(Host(), 4096, "tensor 7");
  ASSERT_THAT(buffer, IsOk());
  EXPECT_EQ((*buffer)->size(), 4096u);
  auto first = (*buffer)->Export();
  auto second = (*buffer)->Export();
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(second, IsOk());
  EXPECT_TRUE(first->data.empty());
  ASSERT_EQ(first->fds.size(), 1u);
  ASSERT_EQ(second->fds.size(), 1u);
  // Each export is a new fd for the caller to close, of the same memfd.
  EXPECT_NE(first->fds[0].get(), second->fds[0].get());
  EXPECT_EQ(Inode(first->fds[0].get()), Inode(second->fds[0].get()));
  auto seals = GetSeals(first->fds[0].get(), "tensor 7");
  ASSERT_THAT(seals, IsOk());
  EXPECT_EQ(*seals & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);
  EXPECT_THAT(backend.Allocate(Host(), 0, "zero"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("zero")));
}

TEST(HostBackendTest, ShareableOnlyOnceTheProducerSealedWrites) {
  HostBackend backend;
  auto buffer = backend.Allocate(Host(), 4096, "tensor 8");
  ASSERT_THAT(buffer, IsOk());
  EXPECT_THAT((*buffer)->CheckShareable("buffer of tensor 8"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("buffer of tensor 8")));
  // The producer's mapping is what adds F_SEAL_FUTURE_WRITE.
  HostImporter importer;
  auto region = importer.Import(Fetched(**buffer), MapMode::kSharedWritable, "buffer 1");
  ASSERT_THAT(region, IsOk());
  EXPECT_THAT((*buffer)->CheckShareable("buffer of tensor 8"), IsOk());
}

TEST(HostBackendTest, AdoptsOneMemfdAndSealsIt) {
  HostBackend backend;
  int raw = memfd_create("exported", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(raw, 0);
  ASSERT_EQ(ftruncate(raw, 8192), 0);
  MemoryHandle handle;
  handle.fds.emplace_back(raw);
  auto adopted = backend.Adopt(Host(), std::move(handle), 0, "exported memfd");
  ASSERT_THAT(adopted, IsOk());
  EXPECT_EQ((*adopted)->size(), 8192u);  // the memfd's own size
  FetchedBuffer fetched = Fetched(**adopted);
  auto seals = GetSeals(fetched.handle.fds[0].get(), "adopted");
  ASSERT_THAT(seals, IsOk());
  EXPECT_EQ(*seals & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);

  MemoryHandle bytes;
  bytes.data = "not a memfd";
  EXPECT_THAT(backend.Adopt(Host(), std::move(bytes), 0, "export 2"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one memfd")));
  UniqueFd file(open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
  MemoryHandle not_memfd;
  not_memfd.fds.push_back(std::move(file));
  EXPECT_THAT(backend.Adopt(Host(), std::move(not_memfd), 0, "export 3"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a memfd")));
}

TEST(HostImporterTest, ReadersSeeTheProducersBytesAndPrivateWritesStayPrivate) {
  HostBackend backend;
  HostImporter importer;
  auto buffer = backend.Allocate(Host(), 4096, "tensor 9");
  ASSERT_THAT(buffer, IsOk());
  auto producer = importer.Import(Fetched(**buffer), MapMode::kSharedWritable, "buffer 1");
  ASSERT_THAT(producer, IsOk());
  std::memcpy((*producer)->data(), "hello", 6);
  auto reader = importer.Import(Fetched(**buffer), MapMode::kPrivate, "buffer 1");
  auto readonly = importer.Import(Fetched(**buffer), MapMode::kSharedReadOnly, "buffer 1");
  ASSERT_THAT(reader, IsOk());
  ASSERT_THAT(readonly, IsOk());
  EXPECT_STREQ(reinterpret_cast<const char*>((*reader)->data()), "hello");
  EXPECT_EQ((*reader)->mode(), MapMode::kPrivate);
  EXPECT_EQ((*reader)->size(), 4096u);
  (*reader)->data()[0] = 'j';
  EXPECT_STREQ(reinterpret_cast<const char*>((*readonly)->data()), "hello");
  // Discarding the private copy reads the buffer again.
  ASSERT_THAT((*reader)->DiscardPrivatePages(0, 4096), IsOk());
  EXPECT_STREQ(reinterpret_cast<const char*>((*reader)->data()), "hello");
  // After the producer's seal nobody maps it writable again.
  EXPECT_THAT(importer.Import(Fetched(**buffer), MapMode::kSharedWritable, "buffer 1"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("buffer 1")));
}

TEST(HostImporterTest, RefusesWhatCouldFaultOrIsNotAHostHandle) {
  HostBackend backend;
  HostImporter importer;
  auto buffer = backend.Allocate(Host(), 4096, "tensor 10");
  ASSERT_THAT(buffer, IsOk());
  FetchedBuffer larger = Fetched(**buffer);
  larger.size = 8192;  // more than the memfd holds: touching the rest would SIGBUS
  EXPECT_THAT(importer.Import(larger, MapMode::kPrivate, "buffer 4"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("buffer 4: the fd holds 4096 bytes")));
  FetchedBuffer with_bytes = Fetched(**buffer);
  with_bytes.handle.data = "cuda handle";
  EXPECT_THAT(importer.Import(with_bytes, MapMode::kPrivate, "buffer 5"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("one memfd")));
  int raw = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(raw, 0);
  ASSERT_EQ(ftruncate(raw, 4096), 0);
  FetchedBuffer unsealed;
  unsealed.size = 4096;
  unsealed.handle.fds.emplace_back(raw);
  EXPECT_THAT(importer.Import(unsealed, MapMode::kPrivate, "buffer 6"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not sealed against shrinking")));
}

TEST(ImportersTest, ByDeviceTypeAndAClearErrorForOthers) {
  Importers importers(MakeImporters());
  auto host = importers.For(v1::DEVICE_TYPE_CPU);
  ASSERT_THAT(host, IsOk());
  EXPECT_EQ((*host)->device_type(), v1::DEVICE_TYPE_CPU);
  EXPECT_THAT(importers.For(static_cast<v1::DeviceType>(7)),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("7")));
  // Every GPU kind is asked of someone: its importer, or one that says why this build has none.
  auto level_zero = importers.For(v1::DEVICE_TYPE_ONEAPI);
  ASSERT_THAT(level_zero, IsOk());
  EXPECT_EQ((*level_zero)->device_type(), v1::DEVICE_TYPE_ONEAPI);
  EXPECT_EQ(&ProcessImporters(), &ProcessImporters());
  // Pinned host views are always asked of someone: the cuda importer, or one that says
  // why this build has none.
  auto pinned = importers.For(v1::DEVICE_TYPE_CUDA_HOST);
  ASSERT_THAT(pinned, IsOk());
  EXPECT_EQ((*pinned)->device_type(), v1::DEVICE_TYPE_CUDA_HOST);
}

TEST(ImportersTest, AnUnbuiltBackendsImporterSaysWhy) {
  UnbuiltImporter importer(v1::DEVICE_TYPE_CUDA_HOST, "cuda", "this build found no cuda.h");
  FetchedBuffer buffer;
  buffer.size = 4096;
  EXPECT_THAT(importer.Import(buffer, MapMode::kSharedReadOnly, "acquire 'cpu/x'"),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("acquire 'cpu/x': DEVICE_TYPE_CUDA_HOST needs the cuda backend, which this "
                                 "build does not have: this build found no cuda.h")));
  v1::Device device;
  device.set_type(v1::DEVICE_TYPE_CUDA_HOST);
  EXPECT_THAT(importer.NameDevice(device), StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("cuda backend")));
}

}  // namespace
}  // namespace tensord::common
