// The registry a daemon hands over (tensord --take-over): the snapshot file refuses what it
// cannot trust as a whole, and Broker::Restore refuses bad entries one by one, logging why,
// and takes the rest. tests/service/test_take_over.py runs the whole hand-over between
// real daemons.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "common/memory/host/memfd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/registry_snapshot.h"
#include "tests/unit/server/broker_fixture.h"

namespace tensord::server {
namespace {

namespace v1 = tensord::v1;
using ::testing::HasSubstr;
using testing::BrokerTest;

class SnapshotTest : public BrokerTest {
 protected:
  // Snapshots this broker, then starts a fresh one (the new daemon) and restores into it.
  Broker::RestoreReport HandOver(void (*tamper)(Broker::Snapshot&) = nullptr) {
    Broker::Snapshot snapshot = broker_->FreezeAndSnapshot();
    if (tamper != nullptr) tamper(snapshot);
    Start([](BrokerOptions&) {});
    return broker_->Restore(snapshot.registry, std::move(snapshot.fds));
  }

  std::string Names() {
    v1::ListRequest request;
    auto listed = broker_->List(Open(), request);
    EXPECT_TRUE(listed.ok()) << listed.status();
    std::string out;
    for (const v1::TensorInfo& info : listed->tensors()) out += info.name() + "@" + std::to_string(info.generation()) + " ";
    return out;
  }
};

TEST_F(SnapshotTest, NamedTensorsKeepTheirGenerationsAndNewOnesComeAfter) {
  uint64_t producer = Open();
  PublishNew(producer, "ns/a");
  PublishNew(producer, "ns/a");
  PublishNew(producer, "other/b");
  Broker::RestoreReport report = HandOver();
  EXPECT_EQ(report.tensors, 2u);
  EXPECT_EQ(report.refused, 0u);
  EXPECT_EQ(Names(), "ns/a@2 other/b@3 ");
  PublishNew(Open(), "ns/a");
  EXPECT_EQ(Names(), "ns/a@4 other/b@3 ");
  auto lease = Acquire(Open(), "other/b");
  EXPECT_TRUE(lease.ok()) << lease.status();
}

TEST_F(SnapshotTest, TheFreezeStopsNameChangesUntilLifted) {
  uint64_t producer = Open();
  PublishNew(producer, "ns/a");
  Broker::Snapshot snapshot = broker_->FreezeAndSnapshot();
  auto allocated = Allocate(producer, "ns", 4);
  ASSERT_TRUE(allocated.ok());
  Seal(producer, *allocated);
  auto published = Publish(producer, allocated->tensor().tensor_id(), "ns/b");
  EXPECT_EQ(published.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(published.status().message()), HasSubstr("a new tensord is taking over"));
  v1::DeleteRequest remove;
  remove.set_name("ns/a");
  EXPECT_EQ(broker_->Delete(producer, remove).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Acquire(Open(), "ns/a").ok());  // reads go on
  broker_->Unfreeze();
  EXPECT_TRUE(Publish(producer, allocated->tensor().tensor_id(), "ns/b").ok());
}

TEST_F(SnapshotTest, BadEntriesAreRefusedOneByOneAndTheRestTaken) {
  uint64_t producer = Open();
  for (const char* name : {"ns/good", "ns/dup", "ns/badgen", "ns/baddesc", "ns/nofd"}) PublishNew(producer, name);
  Broker::RestoreReport report = HandOver([](Broker::Snapshot& s) {
    for (v1::SnapshotTensor& t : *s.registry.mutable_tensors()) {
      if (t.name() == "ns/badgen") t.set_generation(s.registry.last_generation() + 10);
      if (t.name() == "ns/baddesc") t.mutable_desc()->add_shape(1 << 30);  // no longer fits its buffer
      if (t.name() == "ns/nofd") t.set_buffer_id(987654);                   // no such buffer
    }
    v1::SnapshotTensor copy = s.registry.tensors(1);
    *s.registry.add_tensors() = copy;  // a name twice
  });
  EXPECT_EQ(report.tensors, 2u);  // ns/good and the first ns/dup
  EXPECT_EQ(report.refused, 4u);
  EXPECT_EQ(Names().find("badgen"), std::string::npos);
  EXPECT_NE(Names().find("ns/good@1"), std::string::npos);
}

TEST_F(SnapshotTest, ABufferWhoseFdDoesNotMatchItsEntryIsRefusedWithItsTensors) {
  uint64_t producer = Open();
  PublishNew(producer, "ns/a");
  Broker::RestoreReport report = HandOver([](Broker::Snapshot& s) {
    // Another memfd, sealed for readers, but of another size.
    auto other = common::CreateSealedMemfd("other", 3 * 4096);
    ASSERT_TRUE(other.ok());
    ASSERT_TRUE(common::SealFutureWrite(other->get(), "other").ok());
    s.fds[0] = *std::move(other);
  });
  EXPECT_EQ(report.tensors, 0u);
  EXPECT_EQ(report.refused, 1u);
  EXPECT_EQ(broker_->GetStatus().host_bytes_in_use(), 0u);  // its quota went back
  EXPECT_EQ(Names(), "");
}

TEST_F(SnapshotTest, FdIndexesOutsideWhatCameAreRefused) {
  uint64_t producer = Open();
  PublishNew(producer, "ns/a");
  Broker::RestoreReport report = HandOver([](Broker::Snapshot& s) {
    s.registry.mutable_buffers(0)->set_first_fd(0xffffffffu);
    s.registry.mutable_buffers(0)->set_fd_count(2);
  });
  EXPECT_EQ(report.tensors, 0u);
  EXPECT_EQ(report.refused, 1u);
}

// The file: magic, version, length and checksum, and seals.
class SnapshotFileTest : public ::testing::Test {
 protected:
  static std::string Bytes(int fd) {
    std::string out(static_cast<size_t>(lseek(fd, 0, SEEK_END)), '\0');
    EXPECT_EQ(pread(fd, out.data(), out.size(), 0), static_cast<ssize_t>(out.size()));
    return out;
  }
  // A sealed memfd holding `bytes`.
  static common::UniqueFd Sealed(const std::string& bytes, bool seal = true) {
    common::UniqueFd fd(memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    EXPECT_EQ(write(fd.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    if (seal) {
      EXPECT_EQ(fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW), 0);
    }
    return fd;
  }
  static std::string Good() {
    v1::RegistrySnapshot snapshot;
    snapshot.set_last_generation(42);
    snapshot.add_tensors()->set_name("ns/a");
    auto fd = WriteSnapshotMemfd(snapshot);
    EXPECT_TRUE(fd.ok()) << fd.status();
    return Bytes(fd->get());
  }
  static std::string Error(const std::string& bytes, bool seal = true) {
    common::UniqueFd fd = Sealed(bytes, seal);
    auto read = ReadSnapshotMemfd(fd.get());
    EXPECT_FALSE(read.ok());
    return std::string(read.status().message());
  }
};

TEST_F(SnapshotFileTest, ReadsBackWhatWasWritten) {
  common::UniqueFd fd = Sealed(Good());
  auto read = ReadSnapshotMemfd(fd.get());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->last_generation(), 42u);
  EXPECT_EQ(read->tensors(0).name(), "ns/a");
}

TEST_F(SnapshotFileTest, RefusesWhatItCannotTrust) {
  std::string bytes = Good();
  std::string flipped = bytes;
  flipped.back() ^= 0x01;
  EXPECT_THAT(Error(flipped), HasSubstr("bad checksum"));
  std::string version = bytes;
  version[8] = 7;
  EXPECT_THAT(Error(version), HasSubstr("format version 7"));
  EXPECT_THAT(Error(bytes.substr(0, bytes.size() - 1)), HasSubstr("the header says"));
  EXPECT_THAT(Error(bytes.substr(0, 10)), HasSubstr("shorter than its header"));
  EXPECT_THAT(Error("XXXXXXXX" + bytes.substr(8)), HasSubstr("wrong magic"));
  EXPECT_THAT(Error(bytes, /*seal=*/false), HasSubstr("not sealed"));
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  EXPECT_THAT(std::string(ReadSnapshotMemfd(pipe_fds[0]).status().message()), HasSubstr("not a memfd"));
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

}  // namespace
}  // namespace tensord::server
