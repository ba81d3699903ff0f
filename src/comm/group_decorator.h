// GroupDecorator: a Group that forwards every virtual of Group to an inner one, so a wrapper
// (capabilities override, fault injection, the tests' counting group) overrides only what it
// changes. A virtual added to Group must be forwarded here; tests/comm/group_decorator_test.cpp
// calls each one through a decorator and fails for any that reaches the inner group some other way.
#pragma once

#include <deepinfer/comm.h>

#include <memory>
#include <string>
#include <vector>

namespace deepinfer {

class GroupDecorator : public Group {
 public:
  // Borrows `inner`, which must outlive the decorator.
  explicit GroupDecorator(Group& inner) : inner_(&inner) {}
  // Owns `inner`.
  explicit GroupDecorator(std::unique_ptr<Group> inner)
      : owned_(std::move(inner)), inner_(owned_.get()) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  Capabilities capabilities() const override { return inner_->capabilities(); }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    inner_->all_gather(send, recv, count, dtype);
  }
  void all_gather_v(const void* send, size_t send_count, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override {
    inner_->all_gather_v(send, send_count, recv, recv_counts, dtype);
  }
  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    inner_->all_reduce(buf, count, dtype, op);
  }
  void reduce_scatter(const float* send, float* recv, size_t count) override {
    inner_->reduce_scatter(send, recv, count);
  }
  void all_to_all(const void* send, void* recv, size_t count, DType dtype) override {
    inner_->all_to_all(send, recv, count, dtype);
  }
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override {
    inner_->all_to_all_v(send, send_counts, recv, recv_counts, dtype);
  }
  void all_to_all_v_rows(const void* base, size_t row_bytes, std::span<const int64_t> rows,
                         std::span<const int64_t> offsets, void* recv,
                         std::span<const size_t> recv_rows) override {
    inner_->all_to_all_v_rows(base, row_bytes, rows, offsets, recv, recv_rows);
  }
  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    inner_->broadcast(buf, count, dtype, root);
  }
  void barrier() override { inner_->barrier(); }

  PeerMemory peer_memory() const override { return inner_->peer_memory(); }
  void expose(std::span<const std::span<const std::byte>> regions,
              std::vector<const std::byte*>& peers) override {
    inner_->expose(regions, peers);
  }
  void expose_writable(std::span<const std::span<std::byte>> regions,
                       std::vector<std::byte*>& peers) override {
    inner_->expose_writable(regions, peers);
  }
  std::byte* expose_staging(size_t bytes) override { return inner_->expose_staging(bytes); }

 protected:
  Group& inner() const { return *inner_; }

 private:
  std::unique_ptr<Group> owned_;
  Group* inner_;
};

}  // namespace deepinfer
