// The places EPBuffer hands out for x (dispatch_input) and y (combine_input), and the lifetime
// rules that keep a peer-memory view from being reused while the caller still holds it (ep.h).
#pragma once

#include <deepinfer/tensor.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "ep/context.h"

namespace deepinfer::ep {

class InputPlaces {
 public:
  enum class Kind : uint8_t { x, y };
  // Throws Error naming the rule when `op` would reuse the place of a live tensor of `kind`
  // (one dispatch_input or combine_input returned, or any copy of it).
  void check_free(const Context& c, Kind kind, const char* op) const;
  // [rows, H] of dt at `at` (a window view) or, at == nullptr, in this kind's own buffer (reused
  // call after call, grown on demand), counted as a live tensor of `kind` while it or a copy lives.
  Tensor hand_out(const Context& c, Kind kind, std::byte* at, DType dt, int64_t rows);

 private:
  std::vector<std::byte> spare_[2];
  // Every tensor handed out shares its kind's count: use_count() > 1 while one is alive.
  std::shared_ptr<int> views_[2] = {std::make_shared<int>(0), std::make_shared<int>(0)};
};

}  // namespace deepinfer::ep
