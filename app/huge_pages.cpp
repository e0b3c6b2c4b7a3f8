#include "huge_pages.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#endif

#include "device/cpu_allocator.h"

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

}  // namespace

void restart_with_huge_pages(char** argv) {
  const char* flag = std::getenv("DIFFUSE_HUGE_PAGES");
  if (flag && std::string(flag) == "0") return;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.hugetlb")) return;
  const std::string thp = device::transparent_huge_pages_mode();
  if (thp.empty() || thp == "never" || !glibc_has_hugetlb_tunable()) return;
  const std::string value = (tunables && *tunables ? std::string(tunables) + ":" : std::string()) +
                            "glibc.malloc.hugetlb=1";
  if (::setenv("GLIBC_TUNABLES", value.c_str(), 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  // Not restarted (no /proc?): carry on with the default heap, and leave the environment of
  // any child process as it was.
  if (tunables)
    ::setenv("GLIBC_TUNABLES", tunables, 1);
  else
    ::unsetenv("GLIBC_TUNABLES");
}

}  // namespace diffuse::app
