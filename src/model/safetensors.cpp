#include "model/safetensors.h"

#include <deepinfer/error.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"

namespace deepinfer::model {

std::string unsupported_dtype_hint(const std::string& dtype) {
  if (dtype == "F16") return "convert the checkpoint's F16 tensors to BF16";
  if (dtype.rfind("F8_", 0) == 0)
    return fmt::format(
        "convert the {} tensors to F8_E4M3 (OCP e4m3fn, as DeepSeek-V3 ships) with their block "
        "scales, "
        "or to BF16",
        dtype);
  if (dtype.rfind("F", 0) == 0)
    return fmt::format("convert the checkpoint's {} tensors to BF16", dtype);
  return fmt::format(
      "no DeepSeek tensor is {}: re-export the checkpoint with BF16 or F8_E4M3 weights", dtype);
}

namespace {

using nlohmann::json;
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit

DType parse_dtype(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::f32;
  if (s == "F64") return DType::f64;
  if (s == "BF16") return DType::bf16;
  if (s == "F8_E4M3") return DType::e4m3;
  if (s == "F8_E5M2") return DType::e5m2;
  if (s == "I8") return DType::i8;
  if (s == "U8") return DType::u8;
  if (s == "I32") return DType::i32;
  if (s == "I64") return DType::i64;
  DI_FAIL(
      "{}: dtype {} is not supported (supported: F32, F64, BF16, F8_E4M3, F8_E5M2, I8, U8, I32, "
      "I64); {}",
      where, s, unsupported_dtype_hint(s));
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::bf16:
      return "BF16";
    case DType::e4m3:
      return "F8_E4M3";
    case DType::e5m2:
      return "F8_E5M2";
    case DType::i8:
      return "I8";
    case DType::u8:
      return "U8";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
  }
  return "?";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string mismatch_message(const TensorView& t, DType dtype, const std::vector<int64_t>& shape) {
  return fmt::format(
      "tensor {} in {} is {}{}, but config.json implies {}{}: the weights do not match config.json "
      "(a config.json of another model size, or an incomplete conversion?)",
      t.name, std::filesystem::path(t.file).filename().string(), safetensors_dtype_name(t.dtype),
      shape_str(t.shape), safetensors_dtype_name(dtype), shape_str(shape));
}

std::string TensorView::describe() const {
  return fmt::format("{}: {}{} in {}", name, dtype_name(dtype), shape_str(shape),
                     std::filesystem::path(file).filename().string());
}

SafetensorsHeader parse_safetensors(const std::byte* base, size_t size, const std::string& path) {
  if (size < 8)
    DI_FAIL("{} is {} bytes: too short to be a safetensors file (truncated download?)", path, size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);  // little-endian on every platform we build for
  if (header_len > kMaxHeaderBytes || 8 + header_len > size)
    DI_FAIL("{}: header length {} exceeds the file size {} (truncated or not a safetensors file)",
            path, header_len, size);
  json header;
  try {
    header = json::parse(std::string_view(reinterpret_cast<const char*>(base + 8), header_len));
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    DI_FAIL("{}: corrupt safetensors header ({})", path, e.what());
  }
  if (!header.is_object()) DI_FAIL("{}: safetensors header is not a JSON object", path);
  SafetensorsHeader out;
  const size_t data_start = 8 + header_len;
  const size_t data_size = size - data_start;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_object())
        for (auto& [k, v] : entry.items())
          if (v.is_string()) out.metadata[k] = v.get<std::string>();
      continue;
    }
    const std::string where = path + ": tensor " + name;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
      DI_FAIL("{}: header entry lacks dtype/shape/data_offsets", where);
    TensorView t;
    t.name = name;
    t.file = path;
    if (!entry["dtype"].is_string())
      DI_FAIL("{}: dtype must be a string such as \"BF16\", got {}", where, entry["dtype"].dump());
    t.dtype = parse_dtype(entry["dtype"].get<std::string>(), where);
    if (!entry["shape"].is_array())
      DI_FAIL("{}: shape must be an array of sizes, got {}", where, entry["shape"].dump());
    // The bytes the shape needs, computed without overflow: the data check below then bounds
    // the element count, so numel() cannot overflow either.
    uint64_t needed = dtype_size(t.dtype);
    bool overflow = false;
    for (auto& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        DI_FAIL("{}: bad shape {}", where, entry["shape"].dump());
      t.shape.push_back(d.get<int64_t>());
      overflow = overflow || __builtin_mul_overflow(needed, d.get<uint64_t>(), &needed);
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      DI_FAIL("{}: data_offsets must be [begin, end], two byte offsets, got {}", where, off.dump());
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data_size)
      DI_FAIL("{}: data [{}, {}) lies outside the {} data bytes of the file (truncated file?)",
              where, b, e, data_size);
    t.nbytes = size_t(e - b);
    if (overflow || t.nbytes != needed)
      DI_FAIL("{}: {} bytes stored but {}{} needs {}", where, t.nbytes, dtype_name(t.dtype),
              shape_str(t.shape), overflow ? "more than 2^64" : std::to_string(needed));
    t.data = base + data_start + b;
    ranges.emplace_back(b, e);
    out.tensors.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      DI_FAIL("{}: two tensors overlap at byte {} (corrupt header)", path, ranges[i].first);
  return out;
}

std::vector<std::string> parse_safetensors_index(const std::string& json_text,
                                                 const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    DI_FAIL("{}: not valid JSON ({})", source, e.what());
  }
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    DI_FAIL("{}: has no weight_map object", source);
  std::vector<std::string> shards;
  for (auto& [name, file] : j["weight_map"].items()) {
    // A plain file name in the checkpoint folder, as HF writes them.
    if (!file.is_string() || file.get<std::string>().empty() ||
        file.get<std::string>().find('/') != std::string::npos || file == "." || file == "..")
      DI_FAIL("{}: weight_map[\"{}\"] must name a shard file in the same folder, got {}", source,
              name, file.dump(-1, ' ', false, json::error_handler_t::replace));
    const std::string f = file.get<std::string>();
    if (std::find(shards.begin(), shards.end(), f) == shards.end()) shards.push_back(f);
  }
  return shards;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) DI_FAIL("cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    DI_FAIL("cannot stat {}: {}", path, std::strerror(errno));
  }
  map_size_ = size_t(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    DI_FAIL("{} is {} bytes: too short to be a safetensors file (truncated download?)", path,
            map_size_);
  }
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    DI_FAIL("cannot mmap {}: {}", path, std::strerror(errno));
  }
  SafetensorsHeader h;
  try {
    h = parse_safetensors(static_cast<const std::byte*>(map_), map_size_, path);
  } catch (...) {
    ::munmap(map_, map_size_);  // a throwing constructor runs no destructor
    map_ = nullptr;
    throw;
  }
  tensors_ = std::move(h.tensors);
  metadata_ = std::move(h.metadata);
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

void SafetensorsFile::release(const std::byte* data, size_t nbytes) const {
  const auto begin = reinterpret_cast<uintptr_t>(map_), at = reinterpret_cast<uintptr_t>(data);
  if (map_ == nullptr || at < begin || at + nbytes > begin + map_size_) return;
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (at + page - 1) / page * page, hi = (at + nbytes) / page * page;
  // A private read-only mapping never written: dropping its pages loses nothing.
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

void Checkpoint::release(const std::string& name) const {
  if (moved_.count(name) != 0) return;
  if (base_) return base_->release(name);
  const TensorView& t = get(name);
  for (const auto& f : files_) f->release(t.data, t.nbytes);  // only its own file acts
}

void Checkpoint::release(const void* data, size_t nbytes) const {
  if (base_) return base_->release(data, nbytes);
  for (const auto& f : files_) f->release(static_cast<const std::byte*>(data), nbytes);
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) DI_FAIL("checkpoint folder {} does not exist", dir);
  std::vector<std::string> shards;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream f(index);
    if (!f) DI_FAIL("cannot open {}", index.string());
    std::stringstream ss;
    ss << f.rdbuf();
    shards = parse_safetensors_index(ss.str(), index.string());
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    shards.push_back("model.safetensors");
  } else {
    DI_FAIL("{} has neither model.safetensors nor model.safetensors.index.json", dir);
  }
  for (const auto& s : shards) {
    const fs::path p = fs::path(dir) / s;
    if (!fs::exists(p)) DI_FAIL("shard {} named by the index is missing from {}", s, dir);
    files_.push_back(std::make_unique<SafetensorsFile>(p.string()));
    for (const auto& [name, t] : files_.back()->tensors()) {
      auto [it, inserted] = index_.emplace(name, &t);
      if (!inserted) DI_FAIL("tensor {} appears in both {} and {}", name, it->second->file, t.file);
    }
  }
}

Checkpoint::Checkpoint(std::shared_ptr<const Checkpoint> base,
                       const std::map<std::string, const std::byte*>& moved,
                       std::shared_ptr<const void> owner)
    : dir_(base->dir_),
      index_(base->index_),
      base_(std::move(base)),
      moved_owner_(std::move(owner)) {
  for (const auto& [name, data] : moved) {
    TensorView v = base_->get(name);
    v.data = data;
    index_[name] = &moved_.emplace(name, std::move(v)).first->second;
  }
}

const TensorView& Checkpoint::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    DI_FAIL(
        "tensor {} is missing from the checkpoint in {} (incomplete download, or a config.json "
        "that "
        "does not match the weights?)",
        name, dir_);
  return *it->second;
}

const TensorView& Checkpoint::get(const std::string& name, DType dtype,
                                  const std::vector<int64_t>& shape) const {
  const TensorView& t = get(name);
  if (t.dtype != dtype || t.shape != shape) DI_FAIL("{}", mismatch_message(t, dtype, shape));
  return t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> v;
  for (auto& [n, _] : index_) v.push_back(n);
  return v;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (auto& [_, t] : index_) n += t->nbytes;
  return n;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& t : tensors) {
    size_t n = dtype_size(t.dtype);
    for (auto d : t.shape) n *= size_t(d);
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  std::ofstream f(path, std::ios::binary);
  if (!f) DI_FAIL("cannot write {}", path);
  const uint64_t len = h.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(h.data(), std::streamsize(h.size()));
  for (const auto& t : tensors) {
    size_t n = dtype_size(t.dtype);
    for (auto d : t.shape) n *= size_t(d);
    f.write(static_cast<const char*>(t.data), std::streamsize(n));
  }
  if (!f) DI_FAIL("short write to {} (disk full?)", path);
}

}  // namespace deepinfer::model
