#pragma once
/// How much host memory this process may still allocate: the smaller of the system's available
/// memory (MemAvailable) and what the address-space limit (RLIMIT_AS) leaves. Used to refuse, with a
/// coded error naming the tensor, an allocation that would otherwise end in std::bad_alloc or the OOM
/// killer.
#include <cstdint>

namespace nsim::sim {

/// Bytes still allocatable; -1 when unknown (no /proc, no limit).
int64_t host_memory_available();

}  // namespace nsim::sim
