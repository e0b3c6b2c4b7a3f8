#include "bench/page_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

namespace diffuse::bench {

PageCacheState page_cache_state(const std::vector<std::string>& files) {
  PageCacheState s;
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> resident;
  for (const auto& path : files) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      const int64_t size = st.st_size;
      s.bytes += size;
      void* map = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
      if (map != MAP_FAILED) {
        resident.assign(static_cast<size_t>((size + page - 1) / page), 0);
        if (::mincore(map, static_cast<size_t>(size), resident.data()) == 0) {
          for (size_t i = 0; i < resident.size(); ++i)
            if (resident[i] & 1)
              s.resident_bytes += std::min<int64_t>(page, size - static_cast<int64_t>(i) * page);
        }
        ::munmap(map, static_cast<size_t>(size));
      }
    }
    ::close(fd);
  }
  return s;
}

std::vector<std::string> weight_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return {path};
  std::vector<std::string> out;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const auto ext = it->path().extension().string();
    if (ext == ".safetensors" || ext == ".bin" || ext == ".ckpt" || ext == ".pt")
      out.push_back(it->path().string());
  }
  return out;
}

}  // namespace diffuse::bench
