#include "comm/capabilities.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/log.h"

namespace deepinfer {
namespace {

class CapabilitiesOverride final : public Group {
 public:
  CapabilitiesOverride(std::unique_ptr<Group> inner, Capabilities caps)
      : inner_(std::move(inner)), caps_(caps) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  Capabilities capabilities() const override { return caps_; }
  void all_gather(const void* s, void* r, size_t c, DType t) override {
    inner_->all_gather(s, r, c, t);
  }
  void all_gather_v(const void* s, size_t sc, void* r, std::span<const size_t> rc,
                    DType t) override {
    inner_->all_gather_v(s, sc, r, rc, t);
  }
  void all_reduce(void* b, size_t c, DType t, ReduceOp op) override {
    inner_->all_reduce(b, c, t, op);
  }
  void reduce_scatter(const float* s, float* r, size_t c) override {
    inner_->reduce_scatter(s, r, c);
  }
  void all_to_all(const void* s, void* r, size_t c, DType t) override {
    inner_->all_to_all(s, r, c, t);
  }
  void all_to_all_v(const void* s, std::span<const size_t> sc, void* r, std::span<const size_t> rc,
                    DType t) override {
    inner_->all_to_all_v(s, sc, r, rc, t);
  }
  void all_to_all_v_rows(const void* b, size_t rb, std::span<const int64_t> rows, std::span<const int64_t> off,
                         void* r, std::span<const size_t> rr) override {
    inner_->all_to_all_v_rows(b, rb, rows, off, r, rr);
  }
  void broadcast(void* b, size_t c, DType t, int root) override {
    inner_->broadcast(b, c, t, root);
  }
  void barrier() override { inner_->barrier(); }
  PeerMemory peer_memory() const override { return inner_->peer_memory(); }
  void expose(std::span<const std::span<const std::byte>> regions, std::vector<const std::byte*>& peers) override {
    inner_->expose(regions, peers);
  }
  std::byte* expose_staging(size_t bytes) override { return inner_->expose_staging(bytes); }

 private:
  std::unique_ptr<Group> inner_;
  Capabilities caps_;
};

}  // namespace

void save_capabilities(const std::string& path, const Capabilities& caps,
                       const std::string& backend) {
  nlohmann::json j = {{"all_to_all", caps.all_to_all},
                      {"all_to_all_v", caps.all_to_all_v},
                      {"ordered_reduce", caps.ordered_reduce},
                      {"backend", backend}};
  std::ofstream out(path);
  if (!out)
    DI_FAIL("cannot write the capabilities file '{}': check the directory exists and is writable",
            path);
  out << j.dump(2) << '\n';
  if (!out) DI_FAIL("writing the capabilities file '{}' failed", path);
}

CapabilitiesFile load_capabilities(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    DI_FAIL(
        "DEEPINFER_CAPABILITIES: cannot open '{}'; write one with `deepinfer check collectives "
        "--save-capabilities FILE` or unset the variable",
        path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    DI_FAIL("capabilities file '{}' is not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) DI_FAIL("capabilities file '{}' must hold a JSON object", path);
  CapabilitiesFile f;
  auto get_bool = [&](const char* key, bool& out) {
    if (!j.contains(key)) return;  // absent: keep the backend's default
    if (!j[key].is_boolean())
      DI_FAIL("capabilities file '{}': \"{}\" must be true or false, got {}", path, key,
              j[key].dump());
    out = j[key].get<bool>();
  };
  get_bool("all_to_all", f.caps.all_to_all);
  get_bool("all_to_all_v", f.caps.all_to_all_v);
  get_bool("ordered_reduce", f.caps.ordered_reduce);
  for (auto& [key, value] : j.items()) {
    if (key != "all_to_all" && key != "all_to_all_v" && key != "ordered_reduce" && key != "backend")
      DI_FAIL(
          "capabilities file '{}': unknown field \"{}\" (known: all_to_all, all_to_all_v, "
          "ordered_reduce, backend)",
          path, key);
  }
  if (j.contains("backend")) {
    if (!j["backend"].is_string())
      DI_FAIL("capabilities file '{}': \"backend\" must be a string, got {}", path,
              j["backend"].dump());
    f.backend = j["backend"].get<std::string>();
  }
  return f;
}

std::unique_ptr<Group> with_capabilities_override(std::unique_ptr<Group> inner,
                                                  const CapabilitiesFile& file) {
  if (!file.backend.empty() && file.backend != inner->backend() && inner->rank() == 0)
    log_warn(
        "capabilities file was measured on backend '{}' but this run uses '{}'; applying it anyway",
        file.backend, inner->backend());
  return std::make_unique<CapabilitiesOverride>(std::move(inner), file.caps);
}

}  // namespace deepinfer
