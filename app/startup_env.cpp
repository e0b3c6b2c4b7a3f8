#include "startup_env.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#endif

#include "device/cpu_allocator.h"
#include "device/cpu_info.h"

namespace diffuse::app {
namespace {

bool glibc_has_hugetlb_tunable() {
#if defined(__GLIBC__)
  int major = 0, minor = 0;
  return std::sscanf(gnu_get_libc_version(), "%d.%d", &major, &minor) == 2 &&
         (major > 2 || (major == 2 && minor >= 35));
#else
  return false;
#endif
}

// GLIBC_TUNABLES with the huge-page tunable added, or nothing when it is not wanted here.
std::optional<std::string> huge_page_tunables() {
  const char* flag = std::getenv("DIFFUSE_HUGE_PAGES");
  if (flag && std::string(flag) == "0") return std::nullopt;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.hugetlb")) return std::nullopt;
  const std::string thp = device::transparent_huge_pages_mode();
  if (thp.empty() || thp == "never" || !glibc_has_hugetlb_tunable()) return std::nullopt;
  return (tunables && *tunables ? std::string(tunables) + ":" : std::string()) +
         "glibc.malloc.hugetlb=1";
}

bool wants_passive_openmp() {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return false;
  return device::blas_threading() == "pthreads";
}

}  // namespace

void restart_with_startup_settings(char** argv) {
  std::vector<std::pair<const char*, std::string>> settings;
  if (auto tunables = huge_page_tunables()) settings.emplace_back("GLIBC_TUNABLES", *tunables);
  if (wants_passive_openmp()) settings.emplace_back("OMP_WAIT_POLICY", "PASSIVE");
  if (settings.empty()) return;

  std::vector<std::pair<const char*, std::optional<std::string>>> saved;
  for (const auto& [name, value] : settings) {
    const char* old = std::getenv(name);
    saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (::setenv(name, value.c_str(), 1) != 0) break;
  }
  if (saved.size() == settings.size()) ::execv("/proc/self/exe", argv);
  // Not restarted (no /proc?): carry on as started, and leave the environment of any child
  // process as it was.
  for (const auto& [name, old] : saved) {
    if (old)
      ::setenv(name, old->c_str(), 1);
    else
      ::unsetenv(name);
  }
}

}  // namespace diffuse::app
