// A Group that forwards to another and counts each collective: proves which collectives an EP
// algorithm issues (e.g. that `ag` never calls all_to_all).
#pragma once

#include <deepinfer/comm.h>

#include <map>
#include <string>

namespace deepinfer::test {

class CountingGroup final : public Group {
 public:
  explicit CountingGroup(Group& inner) : inner_(inner) {}
  std::map<std::string, int> calls;

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return "counting/" + inner_.backend(); }
  Capabilities capabilities() const override { return inner_.capabilities(); }
  void all_gather(const void* s, void* r, size_t n, DType t) override {
    ++calls["all_gather"];
    inner_.all_gather(s, r, n, t);
  }
  void all_gather_v(const void* s, size_t n, void* r, std::span<const size_t> rc, DType t) override {
    ++calls["all_gather_v"];
    inner_.all_gather_v(s, n, r, rc, t);
  }
  void all_reduce(void* b, size_t n, DType t, ReduceOp op) override {
    ++calls["all_reduce"];
    inner_.all_reduce(b, n, t, op);
  }
  void reduce_scatter(const float* s, float* r, size_t n) override {
    ++calls["reduce_scatter"];
    inner_.reduce_scatter(s, r, n);
  }
  void all_to_all(const void* s, void* r, size_t n, DType t) override {
    ++calls["all_to_all"];
    inner_.all_to_all(s, r, n, t);
  }
  void all_to_all_v(const void* s, std::span<const size_t> sc, void* r, std::span<const size_t> rc,
                    DType t) override {
    ++calls["all_to_all_v"];
    inner_.all_to_all_v(s, sc, r, rc, t);
  }
  void broadcast(void* b, size_t n, DType t, int root) override {
    ++calls["broadcast"];
    inner_.broadcast(b, n, t, root);
  }
  void barrier() override {
    ++calls["barrier"];
    inner_.barrier();
  }
  PeerMemory peer_memory() const override { return inner_.peer_memory(); }
  void expose(std::span<const std::span<const std::byte>> regions, std::vector<const std::byte*>& peers) override {
    ++calls["expose"];
    inner_.expose(regions, peers);
  }

 private:
  Group& inner_;
};

// Same, but declares all_to_all_v untrusted (to force a2a's padded lowering / auto's ag).
class NoA2avGroup final : public Group {
 public:
  explicit NoA2avGroup(Group& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return "no-a2av/" + inner_.backend(); }
  Capabilities capabilities() const override {
    Capabilities c = inner_.capabilities();
    c.all_to_all_v = false;
    return c;
  }
  void all_gather(const void* s, void* r, size_t n, DType t) override { inner_.all_gather(s, r, n, t); }
  void all_gather_v(const void* s, size_t n, void* r, std::span<const size_t> rc, DType t) override {
    inner_.all_gather_v(s, n, r, rc, t);
  }
  void all_reduce(void* b, size_t n, DType t, ReduceOp op) override { inner_.all_reduce(b, n, t, op); }
  void reduce_scatter(const float* s, float* r, size_t n) override { inner_.reduce_scatter(s, r, n); }
  void all_to_all(const void* s, void* r, size_t n, DType t) override { inner_.all_to_all(s, r, n, t); }
  void all_to_all_v(const void*, std::span<const size_t>, void*, std::span<const size_t>, DType) override {
    throw Error("NoA2avGroup: all_to_all_v called although capabilities() distrust it");
  }
  void broadcast(void* b, size_t n, DType t, int root) override { inner_.broadcast(b, n, t, root); }
  void barrier() override { inner_.barrier(); }

 private:
  Group& inner_;
};

}  // namespace deepinfer::test
