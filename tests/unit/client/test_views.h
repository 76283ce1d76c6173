// Helpers for the client unit tests: LeaseViews built without a broker, over real memfds
// (common::CreateSealedMemfd) or with no buffer at all.
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/lease_view.h"
#include "client/mapping_cache.h"
#include "client/release_queue.h"
#include "common/memory/host/host_importer.h"
#include "common/memory/host/mapped_region.h"
#include "common/memory/host/memfd.h"
#include "gtest/gtest.h"

namespace tensord::internal::testing {

inline std::shared_ptr<ReleaseQueue> NewQueue() {
  auto queue = ReleaseQueue::Create();
  EXPECT_TRUE(queue.ok()) << queue.status();
  return *queue;
}

// A view with no mapping (a zero-byte tensor) whose tensor id is `id`.
inline LeaseView* NewBareView(const std::shared_ptr<ReleaseQueue>& queue, uint64_t id,
                              std::string cache_name = "", ViewKind kind = ViewKind::kPrivate) {
  LeaseView::Params p;
  p.info.tensor_id = id;
  p.info.shape = {0};
  p.info.strides = {1};
  p.lease_id = 1000 + id;
  p.kind = kind;
  p.cache_name = std::move(cache_name);
  return new LeaseView(std::move(p), queue);
}

// A sealed memfd of `size` bytes whose byte i holds i % 251, mapped in `mode`.
inline std::shared_ptr<Mapping> NewPatternMapping(uint64_t size, common::MapMode mode) {
  auto fd = common::CreateSealedMemfd("client-test", size);
  EXPECT_TRUE(fd.ok()) << fd.status();
  auto writer = common::MappedRegion::Map(fd->get(), size, common::MapMode::kSharedWritable, "w");
  EXPECT_TRUE(writer.ok()) << writer.status();
  for (uint64_t i = 0; i < size; ++i) writer->data()[i] = static_cast<uint8_t>(i % 251);
  auto region = common::MappedRegion::Map(fd->get(), size, mode, "test");
  EXPECT_TRUE(region.ok()) << region.status();
  return std::make_shared<Mapping>(std::make_unique<common::HostRegion>(*std::move(region)));
}

// True while [addr, addr+len) is mapped in this process.
inline bool IsMapped(const void* addr, size_t len = 4096) {
  unsigned char vec[64];
  uintptr_t page = reinterpret_cast<uintptr_t>(addr) & ~uintptr_t{4095};
  return ::mincore(reinterpret_cast<void*>(page), len, vec) == 0;
}

}  // namespace tensord::internal::testing
