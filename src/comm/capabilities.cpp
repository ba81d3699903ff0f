#include "comm/capabilities.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "comm/group_decorator.h"
#include "core/check.h"
#include "core/log.h"

namespace deepinfer {
namespace {

// Reports the file's capabilities; everything else is the inner group's.
class CapabilitiesOverride final : public GroupDecorator {
 public:
  CapabilitiesOverride(std::unique_ptr<Group> inner, Capabilities caps)
      : GroupDecorator(std::move(inner)), caps_(caps) {}
  Capabilities capabilities() const override { return caps_; }

 private:
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
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_capabilities(ss.str(), path);
}

CapabilitiesFile parse_capabilities(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
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
