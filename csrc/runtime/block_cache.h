// The size classes of device blocks and the per-core cache of freed blocks
// (the simulator's caching allocator). Free of PyTorch headers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace neuron::rt {

// Block sizes: requests up to 64 MiB are rounded up to one of a few size
// classes (four per power of two, at least 512 bytes) so freed blocks can be
// reused by requests of similar size. Reuse also spares the host the page
// faults of fresh memory, which cost more than the allocation itself for
// activation-sized blocks. Larger requests get a block of their exact size and
// are never cached.
constexpr int kMaxCachedLog2 = 26;
constexpr size_t kMinBlock = 512;
constexpr size_t kMaxCachedBlock = size_t{1} << kMaxCachedLog2;
constexpr int kNumClasses = 1 + 4 * (kMaxCachedLog2 - 9);  // 512, then (512, 64 MiB] in quarter steps
// Bound on what a core keeps cached, so the simulator's host memory stays
// close to what tensors use.
constexpr uint64_t kMaxCachedBytes = uint64_t{256} << 20;

inline int size_class(size_t nbytes) {
  if (nbytes <= kMinBlock) return 0;
  const int e = 63 - __builtin_clzll(nbytes - 1);  // 2^e < nbytes <= 2^(e+1)
  return 1 + (e - 9) * 4 + static_cast<int>(((nbytes - 1) >> (e - 2)) & 3);
}

inline size_t class_bytes(int cls) {
  if (cls == 0) return kMinBlock;
  const int e = 9 + (cls - 1) / 4;
  return (size_t{1} << e) + static_cast<size_t>((cls - 1) % 4 + 1) * (size_t{1} << (e - 2));
}

// The bytes a request of nbytes reserves.
inline size_t block_bytes(size_t nbytes) {
  return nbytes <= kMaxCachedBlock ? class_bytes(size_class(nbytes)) : nbytes;
}

// Freed blocks of one core, one intrusive list per size class: a cached
// block's first word links to the next one. Not thread-safe (the runtime's
// lock guards it).
struct BlockCache {
  std::array<void*, kNumClasses> heads{};
  uint64_t bytes = 0;

  void* pop(int cls) {
    void* p = heads[cls];
    if (p) {
      heads[cls] = *static_cast<void**>(p);
      bytes -= class_bytes(cls);
    }
    return p;
  }
  bool push(void* p, size_t block) {
    if (block > kMaxCachedBlock || bytes + block > kMaxCachedBytes) return false;
    const int cls = size_class(block);
    *static_cast<void**>(p) = heads[cls];
    heads[cls] = p;
    bytes += block;
    return true;
  }
  // Unlinks every block; the caller frees them outside the lock.
  uint64_t take_all(std::vector<void*>& out) {
    for (auto& head : heads)
      for (void* p = head; p; p = *static_cast<void**>(p)) out.push_back(p);
    heads.fill(nullptr);
    uint64_t n = bytes;
    bytes = 0;
    return n;
  }
};

}  // namespace neuron::rt
