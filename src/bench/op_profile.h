// Where a model's time goes by operator kind: while an OpProfile is alive, every outermost
// operator that runs on the calling thread (LibTorch's, and the engine's own recorded kernels:
// diffuse::attention, the fused norms, GEGLU) is timed from start to end and filed under a
// kind (conv, matmul, attention, norm, activation, elementwise, copy/layout, other). Nested
// operators count once, in their outermost one, so the kinds add up to the time spent inside
// operators; the rest of a step is Python-free glue (module calls, tensor bookkeeping).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace diffuse::bench {

struct OpTime {
  std::string name;  // a kind, or an operator's name
  double seconds = 0;
  int64_t calls = 0;
};

class OpProfile {
 public:
  OpProfile();  // starts on the calling thread (one at a time per thread)
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  // Longest first.
  std::vector<OpTime> by_kind() const;
  std::vector<OpTime> by_operator(size_t most) const;
  double total_s() const;

  // The kind an operator name is filed under.
  static std::string kind_of(const std::string& op);

 private:
  std::map<std::string, OpTime> ops_;
  uint64_t handle_;
};

}  // namespace diffuse::bench
