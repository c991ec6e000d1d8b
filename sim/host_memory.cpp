#include "sim/host_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>

namespace nsim::sim {

namespace {

// MemAvailable of /proc/meminfo in bytes, -1 if unknown.
int64_t mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}

// Virtual size of this process in bytes (/proc/self/statm, first field in pages), -1 if unknown.
int64_t vm_size() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0;
  if (!(f >> pages)) return -1;
  return pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

int64_t host_memory_available() {
  int64_t avail = mem_available();
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    const int64_t vm = vm_size();
    const auto lim = rl.rlim_cur > static_cast<rlim_t>(std::numeric_limits<int64_t>::max())
                         ? std::numeric_limits<int64_t>::max()
                         : static_cast<int64_t>(rl.rlim_cur);
    if (vm >= 0) {
      const int64_t left = lim > vm ? lim - vm : 0;
      avail = avail < 0 ? left : std::min(avail, left);
    }
  }
  return avail;
}

}  // namespace nsim::sim
