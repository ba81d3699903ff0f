// A small Tensor: dtype, shape, strides (in elements), owning or borrowed storage.
// Enough for the engine's plumbing; kernels take raw pointers + params structs.
#pragma once

#include <deepinfer/dtype.h>
#include <deepinfer/error.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace deepinfer {

namespace detail {
// A misused Tensor (a bug in the caller): throws InternalError with `what` (host_memory.cpp).
[[noreturn]] void tensor_error(const std::string& what);
// 64-byte aligned storage of at least `bytes`; large blocks are cached for reuse (host_memory.cpp).
std::shared_ptr<std::byte> host_alloc(size_t bytes);
// Bytes of released storage held for reuse (tests, diagnostics).
size_t host_alloc_idle_bytes();
// 64-byte aligned storage for weights the engine streams every step, packed into 2 MiB-aligned
// chunks the kernel is asked to back with transparent huge pages (host_memory.cpp). A chunk goes
// back to the OS when the last storage in it is released.
std::shared_ptr<std::byte> weight_alloc(size_t bytes);
}  // namespace detail

// Process-wide: tells glibc malloc to keep freed memory (no heap trim; mmap only from 32 MiB), so
// per-step vectors and small tensors reuse mapped pages instead of faulting them in again (on a
// VM each first touch is a costly fault: docs/performance.md §6). The deepinfer CLI calls it at
// startup; an embedding application may. Memory freed stays with the process for reuse.
void keep_freed_host_memory();

class Tensor {
 public:
  Tensor() = default;

  // Owning, contiguous, 64-byte aligned. Contents are uninitialised.
  static Tensor empty(DType dtype, std::vector<int64_t> shape) {
    check_shape(shape);
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    t.strides_ = contiguous_strides(t.shape_);
    std::shared_ptr<std::byte> storage = detail::host_alloc(t.numel() * dtype_size(dtype));
    t.data_ = storage.get();
    t.storage_ = std::move(storage);
    return t;
  }
  static Tensor zeros(DType dtype, std::vector<int64_t> shape) {
    Tensor t = empty(dtype, std::move(shape));
    std::memset(t.data_, 0, t.nbytes());
    return t;
  }
  // Non-owning view of caller memory (the caller keeps it alive). Empty strides = contiguous.
  static Tensor borrow(void* data, DType dtype, std::vector<int64_t> shape,
                       std::vector<int64_t> strides = {}) {
    check_shape(shape);
    Tensor t;
    t.dtype_ = dtype;
    t.data_ = data;
    t.strides_ = strides.empty() ? contiguous_strides(shape) : std::move(strides);
    t.shape_ = std::move(shape);
    if (t.strides_.size() != t.shape_.size()) [[unlikely]]
      detail::tensor_error("strides rank " + std::to_string(t.strides_.size()) + " != shape rank " +
                           std::to_string(t.shape_.size()));
    return t;
  }

  // A view of memory that `owner` stands for (data = owner.get()): the tensor and every copy of
  // it share owner's use count, so whoever hands such views out can tell whether one is alive
  // (EPBuffer's input places). owning() is true: the owner keeps the count, not the memory.
  static Tensor borrow(std::shared_ptr<std::byte> owner, DType dtype, std::vector<int64_t> shape) {
    Tensor t = borrow(owner.get(), dtype, std::move(shape));
    t.storage_ = std::move(owner);
    return t;
  }

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int ndim() const { return int(shape_.size()); }
  int64_t dim(int i) const {
    const int j = i < 0 ? i + ndim() : i;
    if (j < 0 || j >= ndim()) [[unlikely]]
      detail::tensor_error("dim " + std::to_string(i) + " out of range for a " +
                           std::to_string(ndim()) + "-d tensor");
    return shape_[size_t(j)];
  }
  int64_t numel() const {
    return std::accumulate(shape_.begin(), shape_.end(), int64_t(1), std::multiplies<>());
  }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr; }
  bool owning() const { return storage_ != nullptr; }
  bool is_contiguous() const { return strides_ == contiguous_strides(shape_); }

  void* raw() const { return data_; }
  template <class T>
  T* data() const {
    return static_cast<T*>(data_);
  }

  // Same storage, new contiguous shape (numel must match).
  Tensor view(std::vector<int64_t> shape) const {
    if (!is_contiguous()) [[unlikely]]
      detail::tensor_error("view() needs a contiguous tensor");
    check_shape(shape);
    Tensor t = *this;
    t.strides_ = contiguous_strides(shape);
    t.shape_ = std::move(shape);
    if (t.numel() != numel()) [[unlikely]]
      detail::tensor_error("view of " + std::to_string(numel()) + " elements as " +
                           std::to_string(t.numel()) + " elements");
    return t;
  }
  // Rows [begin, end) of dim 0, sharing storage.
  Tensor rows(int64_t begin, int64_t end) const {
    if (!(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0])) [[unlikely]]
      detail::tensor_error("rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                           ") out of range for dim0 = " + std::to_string(ndim() ? shape_[0] : 0));
    Tensor t = *this;
    t.shape_[0] = end - begin;
    t.data_ = static_cast<std::byte*>(data_) + begin * strides_[0] * int64_t(dtype_size(dtype_));
    return t;
  }
  // Deep copy into new owning storage; an undefined tensor clones to an undefined one.
  Tensor clone() const {
    if (!defined()) return Tensor();
    if (!is_contiguous()) [[unlikely]]
      detail::tensor_error("clone() needs a contiguous tensor");
    Tensor t = empty(dtype_, shape_);
    if (nbytes()) std::memcpy(t.data_, data_, nbytes());
    return t;
  }

  std::string describe() const {
    std::string s = std::string(dtype_name(dtype_)) + "[";
    for (size_t i = 0; i < shape_.size(); ++i) s += (i ? ", " : "") + std::to_string(shape_[i]);
    return s + "]";
  }

  static std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
    std::vector<int64_t> s(shape.size(), 1);
    for (int i = int(shape.size()) - 2; i >= 0; --i)
      s[size_t(i)] = s[size_t(i) + 1] * shape[size_t(i) + 1];
    return s;
  }

 private:
  static void check_shape(const std::vector<int64_t>& shape) {
    for (size_t i = 0; i < shape.size(); ++i)
      if (shape[i] < 0) [[unlikely]]
        detail::tensor_error("negative size " + std::to_string(shape[i]) + " for dimension " +
                             std::to_string(i) + " of a " + std::to_string(shape.size()) +
                             "-d shape");
  }

  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  void* data_ = nullptr;
  std::shared_ptr<std::byte> storage_;
};

}  // namespace deepinfer
