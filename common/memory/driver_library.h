// A GPU driver's library loaded at run time (cuda_driver.h, ze_loader.h): which file,
// dlopen and dlsym, with reasons that name the step that failed and what it means. Header
// only: each backend's library uses it without depending on another.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace tensord::common {

// `override_variable`'s value when it is set and not empty (a test hook, read now), else
// `default_name`.
inline std::string DriverLibraryPath(const char* override_variable, const char* default_name) {
  const char* value = std::getenv(override_variable);
  return value != nullptr && *value != '\0' ? value : default_name;
}

// dlopen(RTLD_NOW|RTLD_LOCAL) of `path`; null with `*why` = "<path> not found (dlopen:
// <error>): <absent_hint>" when it fails.
inline void* OpenDriverLibrary(const std::string& path, std::string_view absent_hint, std::string* why) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = ::dlerror();
    *why = path + " not found (dlopen: " + (err != nullptr ? err : "unknown error") + "): " + std::string(absent_hint);
  }
  return handle;
}

// dlsym of `name`; null with `*why` = "<path> lacks <name> (dlsym: <error>): <hint>".
inline void* DriverSymbol(void* handle, const std::string& path, const char* name, std::string_view hint,
                          std::string* why) {
  ::dlerror();
  void* symbol = ::dlsym(handle, name);
  if (symbol == nullptr) {
    const char* err = ::dlerror();
    *why = path + " lacks " + name + " (dlsym: " + (err != nullptr ? err : "null symbol") + "): " + std::string(hint);
  }
  return symbol;
}

}  // namespace tensord::common
