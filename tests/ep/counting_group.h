// A Group that forwards to another and counts each call: proves which collectives an EP
// algorithm issues (e.g. that `ag` never calls all_to_all). Every call reaches the inner group's
// own implementation (LocalGroup's all_to_all_v_rows, expose_staging), not a fallback.
#pragma once

#include <deepinfer/comm.h>

#include <map>
#include <string>

#include "comm/group_decorator.h"

namespace deepinfer::test {

class CountingGroup final : public GroupDecorator {
 public:
  explicit CountingGroup(Group& inner) : GroupDecorator(inner) {}
  std::map<std::string, int> calls;

  // The calls of the data-moving collectives that exchange between all pairs of ranks.
  int all_to_alls() {
    return calls["all_to_all"] + calls["all_to_all_v"] + calls["all_to_all_v_rows"];
  }

  std::string backend() const override { return "counting/" + inner().backend(); }
  void all_gather(const void* s, void* r, size_t n, DType t) override {
    ++calls["all_gather"];
    GroupDecorator::all_gather(s, r, n, t);
  }
  void all_gather_v(const void* s, size_t n, void* r, std::span<const size_t> rc,
                    DType t) override {
    ++calls["all_gather_v"];
    GroupDecorator::all_gather_v(s, n, r, rc, t);
  }
  void all_reduce(void* b, size_t n, DType t, ReduceOp op) override {
    ++calls["all_reduce"];
    GroupDecorator::all_reduce(b, n, t, op);
  }
  void reduce_scatter(const float* s, float* r, size_t n) override {
    ++calls["reduce_scatter"];
    GroupDecorator::reduce_scatter(s, r, n);
  }
  void all_to_all(const void* s, void* r, size_t n, DType t) override {
    ++calls["all_to_all"];
    GroupDecorator::all_to_all(s, r, n, t);
  }
  void all_to_all_v(const void* s, std::span<const size_t> sc, void* r, std::span<const size_t> rc,
                    DType t) override {
    ++calls["all_to_all_v"];
    GroupDecorator::all_to_all_v(s, sc, r, rc, t);
  }
  void all_to_all_v_rows(const void* b, size_t rb, std::span<const int64_t> rows,
                         std::span<const int64_t> off, void* r,
                         std::span<const size_t> rr) override {
    ++calls["all_to_all_v_rows"];
    GroupDecorator::all_to_all_v_rows(b, rb, rows, off, r, rr);
  }
  void broadcast(void* b, size_t n, DType t, int root) override {
    ++calls["broadcast"];
    GroupDecorator::broadcast(b, n, t, root);
  }
  void barrier() override {
    ++calls["barrier"];
    GroupDecorator::barrier();
  }
  void expose(std::span<const std::span<const std::byte>> regions,
              std::vector<const std::byte*>& peers) override {
    ++calls["expose"];
    GroupDecorator::expose(regions, peers);
  }
  void expose_writable(std::span<const std::span<std::byte>> regions,
                       std::vector<std::byte*>& peers) override {
    ++calls["expose_writable"];
    GroupDecorator::expose_writable(regions, peers);
  }
  std::byte* expose_staging(size_t bytes) override {
    ++calls["expose_staging"];
    return GroupDecorator::expose_staging(bytes);
  }
};

// Declares all_to_all_v untrusted (to force a2a's padded lowering / auto's ag), and fails any
// call of it (all_to_all_v_rows is the same exchange).
class NoA2avGroup final : public GroupDecorator {
 public:
  explicit NoA2avGroup(Group& inner) : GroupDecorator(inner) {}
  std::string backend() const override { return "no-a2av/" + inner().backend(); }
  Capabilities capabilities() const override {
    Capabilities c = inner().capabilities();
    c.all_to_all_v = false;
    return c;
  }
  void all_to_all_v(const void*, std::span<const size_t>, void*, std::span<const size_t>,
                    DType) override {
    throw Error("NoA2avGroup: all_to_all_v called although capabilities() distrust it");
  }
  void all_to_all_v_rows(const void*, size_t, std::span<const int64_t>, std::span<const int64_t>,
                         void*, std::span<const size_t>) override {
    throw Error(
        "NoA2avGroup: all_to_all_v_rows called although capabilities() distrust all_to_all_v");
  }
};

}  // namespace deepinfer::test
