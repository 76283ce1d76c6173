#include "common/memory/host/memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/memory/host/mapped_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::common {
namespace {

using ::tensord::common::testing::IsOk;
using ::tensord::common::testing::IsOkAndHolds;
using ::tensord::common::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kSize = 1 << 16;

TEST(MemfdTest, CreateSealsSizeButNotWrites) {
  auto fd = CreateSealedMemfd("tensor 1", kSize);
  ASSERT_THAT(fd, IsOk());
  auto seals = GetSeals(fd->get(), "tensor 1");
  ASSERT_THAT(seals, IsOk());
  EXPECT_TRUE(*seals & F_SEAL_SHRINK);
  EXPECT_TRUE(*seals & F_SEAL_GROW);
  EXPECT_FALSE(*seals & F_SEAL_SEAL) << "the producer still has to add FUTURE_WRITE";
  EXPECT_FALSE(*seals & F_SEAL_FUTURE_WRITE);
  EXPECT_THAT(FdSize(fd->get(), "tensor 1"), IsOkAndHolds(kSize));
  EXPECT_TRUE(fcntl(fd->get(), F_GETFD) & FD_CLOEXEC);
  // ftruncate in either direction fails once sealed.
  EXPECT_NE(ftruncate(fd->get(), kSize * 2), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(fd->get(), kSize / 2), 0);
  EXPECT_EQ(errno, EPERM);
  // fallocate reserved the pages: the whole size is backed already.
  struct stat st {};
  ASSERT_EQ(fstat(fd->get(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, kSize);
}

TEST(MemfdTest, RefusesZeroSize) {
  EXPECT_THAT(CreateSealedMemfd("empty", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty: size 0")));
}

TEST(MemfdTest, ImpossibleReservationIsResourceExhausted) {
  // 2^50 bytes: larger than any machine this runs on, but within off_t.
  EXPECT_THAT(CreateSealedMemfd("huge", uint64_t{1} << 50),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("reserve 1073741824 MiB for huge")));
}

TEST(MemfdTest, FutureWriteSealBlocksSharedWritesOnly) {
  auto fd = CreateSealedMemfd("tensor 2", kSize);
  ASSERT_THAT(fd, IsOk());
  // The producer maps writable, fills, then seals.
  auto producer = MappedRegion::Map(fd->get(), kSize, MapMode::kSharedWritable, "producer");
  ASSERT_THAT(producer, IsOk());
  std::memset(producer->data(), 'p', kSize);
  EXPECT_THAT(CheckReaderSeals(fd->get(), "tensor 2"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("tensor 2: missing seals F_SEAL_FUTURE_WRITE"),
                             Not(HasSubstr("missing seals F_SEAL_SHRINK")))));
  ASSERT_THAT(SealFutureWrite(fd->get(), "tensor 2"), IsOk());
  EXPECT_THAT(CheckReaderSeals(fd->get(), "tensor 2"), IsOk());

  // A new shared writable mapping is refused by the kernel ...
  void* shared_rw = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(), 0);
  EXPECT_EQ(shared_rw, MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  EXPECT_THAT(MappedRegion::Map(fd->get(), kSize, MapMode::kSharedWritable, "reader"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("mmap reader")));
  // ... and so are write(2) and a read-only shared mapping made writable later.
  EXPECT_EQ(pwrite(fd->get(), "x", 1, 0), -1);
  EXPECT_EQ(errno, EPERM);
  auto reader = MappedRegion::Map(fd->get(), kSize, MapMode::kSharedReadOnly, "reader");
  ASSERT_THAT(reader, IsOk());
  EXPECT_NE(mprotect(reader->data(), kSize, PROT_READ | PROT_WRITE), 0);

  // A private writable mapping works, and its writes stay private.
  auto consumer = MappedRegion::Map(fd->get(), kSize, MapMode::kPrivate, "consumer");
  ASSERT_THAT(consumer, IsOk());
  EXPECT_EQ(consumer->data()[0], 'p');
  consumer->data()[0] = 'c';
  EXPECT_EQ(consumer->data()[0], 'c');
  EXPECT_EQ(reader->data()[0], 'p');
  char byte = 0;
  ASSERT_EQ(pread(fd->get(), &byte, 1, 0), 1);
  EXPECT_EQ(byte, 'p');

  // The producer's own mapping predates the seal and stays writable (documented hazard).
  producer->data()[1] = 'q';
  EXPECT_EQ(reader->data()[1], 'q');
}

TEST(MemfdTest, CheckReaderSealsNamesEveryMissingSeal) {
  UniqueFd fd(memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(fd.valid());
  EXPECT_THAT(CheckReaderSeals(fd.get(), "export 3"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_FUTURE_WRITE")));
}

TEST(MemfdTest, SealWriteStandsInForFutureWrite) {
  auto fd = CreateSealedMemfd("tensor 8", 4096);
  ASSERT_THAT(fd, IsOk());
  ASSERT_EQ(fcntl(fd->get(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  EXPECT_THAT(CheckReaderSeals(fd->get(), "tensor 8"), IsOk());
}

TEST(MemfdTest, CheckReaderSealsRefusesNonMemfd) {
  UniqueFd fd(open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  EXPECT_THAT(CheckReaderSeals(fd.get(), "exe"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("exe: not a memfd")));
}

TEST(MemfdTest, PrepareExportedMemfdAddsSizeSeals) {
  UniqueFd fd(memfd_create("export", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(ftruncate(fd.get(), 8192), 0);
  EXPECT_THAT(PrepareExportedMemfd(fd.get(), "export 4"), IsOkAndHolds(uint64_t{8192}));
  auto seals = GetSeals(fd.get(), "export 4");
  ASSERT_THAT(seals, IsOk());
  EXPECT_EQ(*seals & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);
  // Idempotent.
  EXPECT_THAT(PrepareExportedMemfd(fd.get(), "export 4"), IsOkAndHolds(uint64_t{8192}));
}

TEST(MemfdTest, PrepareExportedMemfdRefusesUnsealable) {
  // Without MFD_ALLOW_SEALING the kernel sets F_SEAL_SEAL.
  UniqueFd fd(memfd_create("no-sealing", MFD_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  EXPECT_THAT(PrepareExportedMemfd(fd.get(), "export 5"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("export 5")));
  UniqueFd file(open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
  EXPECT_THAT(PrepareExportedMemfd(file.get(), "export 6"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a memfd")));
}

}  // namespace
}  // namespace tensord::common
