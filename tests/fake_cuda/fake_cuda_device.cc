// libtensord_fake_cuda.so: error names and strings, cuInit (TENSORD_FAKE_CUDA_DEVICES,
// CUDA_VISIBLE_DEVICES, TENSORD_FAKE_CUDA_NO_READ_ONLY), the devices, their primary contexts
// and the calling thread's context stack.
#include "tests/fake_cuda/fake_cuda_state.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using fake_cuda::S;
using fake_cuda::ValidOrdinal;
using fake_cuda::kMaxDevices;
using fake_cuda::kTotalMem;

namespace {

thread_local std::vector<CUcontext> t_context_stack;

std::string UuidBytes(int physical) {
  const unsigned char b[16] = {0x8a, 0x3f, 0x1c, 0x5e, 0x22, 0x41, 0x4b, 0x7d,
                               0x9c, 0x0e, 0x6f, 0x13, 0x55, 0xa2, 0x00, static_cast<unsigned char>(physical)};
  return std::string(reinterpret_cast<const char*>(b), 16);
}

std::string UuidText(int physical) {
  std::string bytes = UuidBytes(physical);
  static const char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[static_cast<unsigned char>(bytes[i]) >> 4];
    out += kHex[static_cast<unsigned char>(bytes[i]) & 0xf];
  }
  return out;
}

// One CUDA_VISIBLE_DEVICES entry -> physical device, or -1.
int ParseVisibleEntry(std::string entry, int physical_count) {
  while (!entry.empty() && entry.front() == ' ') entry.erase(entry.begin());
  while (!entry.empty() && entry.back() == ' ') entry.pop_back();
  if (entry.empty()) return -1;
  if (entry.rfind("GPU-", 0) == 0) {
    int match = -1;
    for (int p = 0; p < physical_count; ++p) {
      if (UuidText(p).rfind(entry, 0) == 0) {
        if (match >= 0) return -1;  // an ambiguous prefix names no device
        match = p;
      }
    }
    return match;
  }
  char* end = nullptr;
  long ordinal = std::strtol(entry.c_str(), &end, 10);
  if (*end != '\0' || ordinal < 0 || ordinal >= physical_count) return -1;
  return static_cast<int>(ordinal);
}

}  // namespace

namespace fake_cuda {

CUctx_st* Current() { return t_context_stack.empty() ? nullptr : t_context_stack.back(); }

}  // namespace fake_cuda

extern "C" {

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  switch (error) {
#define FAKE_NAME(e) \
  case e:            \
    *pStr = #e;      \
    return CUDA_SUCCESS;
    FAKE_NAME(CUDA_SUCCESS)
    FAKE_NAME(CUDA_ERROR_INVALID_VALUE)
    FAKE_NAME(CUDA_ERROR_OUT_OF_MEMORY)
    FAKE_NAME(CUDA_ERROR_NOT_INITIALIZED)
    FAKE_NAME(CUDA_ERROR_NO_DEVICE)
    FAKE_NAME(CUDA_ERROR_INVALID_DEVICE)
    FAKE_NAME(CUDA_ERROR_INVALID_CONTEXT)
    FAKE_NAME(CUDA_ERROR_ALREADY_MAPPED)
    FAKE_NAME(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
    FAKE_NAME(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
    FAKE_NAME(CUDA_ERROR_INVALID_HANDLE)
    FAKE_NAME(CUDA_ERROR_ILLEGAL_ADDRESS)
    FAKE_NAME(CUDA_ERROR_NOT_PERMITTED)
    FAKE_NAME(CUDA_ERROR_NOT_SUPPORTED)
    FAKE_NAME(CUDA_ERROR_NOT_FOUND)
    FAKE_NAME(CUDA_ERROR_UNKNOWN)
#undef FAKE_NAME
    default:
      *pStr = nullptr;
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  switch (error) {
    case CUDA_SUCCESS: *pStr = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *pStr = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *pStr = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *pStr = "initialization error"; break;
    case CUDA_ERROR_NO_DEVICE: *pStr = "no CUDA-capable device is detected"; break;
    case CUDA_ERROR_INVALID_DEVICE: *pStr = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *pStr = "invalid device context"; break;
    case CUDA_ERROR_ALREADY_MAPPED: *pStr = "resource already mapped"; break;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: *pStr = "part or all of the requested memory range is already mapped"; break;
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: *pStr = "pointer does not correspond to a registered memory region"; break;
    case CUDA_ERROR_INVALID_HANDLE: *pStr = "invalid resource handle"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *pStr = "an illegal memory access was encountered"; break;
    case CUDA_ERROR_NOT_PERMITTED: *pStr = "operation not permitted"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *pStr = "operation not supported"; break;
    case CUDA_ERROR_NOT_FOUND: *pStr = "named symbol not found"; break;
    case CUDA_ERROR_UNKNOWN: *pStr = "unknown error"; break;
    default: *pStr = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuInit(unsigned int Flags) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (S().initialized) return CUDA_SUCCESS;
  const char* devices = std::getenv("TENSORD_FAKE_CUDA_DEVICES");
  int count = devices != nullptr ? std::atoi(devices) : 1;
  if (count < 0) count = 0;
  if (count > kMaxDevices) count = kMaxDevices;
  S().physical_count = count;
  S().visible.clear();
  if (const char* list = std::getenv("CUDA_VISIBLE_DEVICES"); list != nullptr) {
    // Set but empty hides every device.
    std::string rest = list;
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      int physical = ParseVisibleEntry(rest.substr(0, comma), count);
      bool duplicate = false;
      for (int v : S().visible) duplicate |= (v == physical);
      if (physical < 0 || duplicate) break;  // the real driver stops at the first bad entry
      S().visible.push_back(physical);
      rest = comma == std::string::npos ? std::string() : rest.substr(comma + 1);
    }
  } else {
    for (int p = 0; p < count; ++p) S().visible.push_back(p);
  }
  if (S().visible.empty()) return CUDA_ERROR_NO_DEVICE;
  const char* no_read_only = std::getenv("TENSORD_FAKE_CUDA_NO_READ_ONLY");
  S().no_read_only = no_read_only != nullptr && std::strcmp(no_read_only, "1") == 0;
  for (size_t i = 0; i < S().visible.size(); ++i) {
    S().contexts[i].ordinal = static_cast<int>(i);
    S().contexts[i].physical = S().visible[i];
  }
  S().initialized = true;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  FAKE_ENTER("cuDeviceGetCount");
  *count = static_cast<int>(S().visible.size());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  FAKE_ENTER("cuDeviceGet");
  if (!ValidOrdinal(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetName");
  if (!ValidOrdinal(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<size_t>(len), "tensord fake CUDA device %d", S().visible[dev]);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetUuid_v2");
  if (!ValidOrdinal(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::memcpy(uuid->bytes, UuidBytes(S().visible[dev]).data(), 16);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  FAKE_ENTER("cuDeviceTotalMem_v2");
  if (!ValidOrdinal(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = kTotalMem;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetAttribute");
  if (!ValidOrdinal(dev)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *pi = 1;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;  // the fake models no other attribute
  }
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRetain");
  if (!ValidOrdinal(dev)) return CUDA_ERROR_INVALID_DEVICE;
  ++S().contexts[dev].retains;
  *pctx = &S().contexts[dev];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRelease_v2");
  if (!ValidOrdinal(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (S().contexts[dev].retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --S().contexts[dev].retains;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  FAKE_ENTER("cuCtxPushCurrent_v2");
  if (ctx == nullptr || ctx->retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  t_context_stack.push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  FAKE_ENTER("cuCtxPopCurrent_v2");
  if (t_context_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = t_context_stack.back();
  t_context_stack.pop_back();
  return CUDA_SUCCESS;
}

}  // extern "C"
