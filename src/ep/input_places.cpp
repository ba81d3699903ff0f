#include "ep/input_places.h"

#include "core/check.h"

namespace deepinfer::ep {

void InputPlaces::check_free(const Context& c, Kind kind, const char* op) const {
  if (views_[int(kind)].use_count() <= 1) return;
  const bool x = kind == Kind::x;
  DI_FAIL(
      "ep {} on rank {}/{}: a tensor from {} is still alive, and {} reuses its place (on a shared "
      "window "
      "the very bytes); {}",
      op, c.rank, c.world, x ? "dispatch_input (x)" : "combine_input (y)", op,
      x ? "read x first (e.g. the shared experts), then drop every copy of it, DispatchInput::x "
          "included"
        : "drop y (and every copy of it) once its combine has returned");
}

Tensor InputPlaces::hand_out(const Context& c, Kind kind, std::byte* at, DType dt, int64_t rows) {
  if (!at) {
    // A serving loop writes a layer's x or y here, and the next layer's call takes the same bytes
    // back.
    std::vector<std::byte>& buf = spare_[int(kind)];
    const size_t bytes = size_t(rows) * size_t(c.cfg.hidden) * dtype_size(dt);
    if (buf.size() < bytes) buf.resize(bytes);
    at = buf.data();
  }
  return Tensor::borrow(std::shared_ptr<std::byte>(views_[int(kind)], at), dt,
                        {rows, c.cfg.hidden});
}

}  // namespace deepinfer::ep
