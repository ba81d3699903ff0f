// Read-only, mmap'd safetensors checkpoints: one model.safetensors or shards named by
// model.safetensors.index.json. Every header is validated against the file size, so a
// truncated or corrupt file is an error naming the file and tensor, never a wild read.
#pragma once

#include <deepinfer/dtype.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace deepinfer::model {

struct TensorView {
  std::string name;
  std::string file;
  DType dtype = DType::u8;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // inside the mmap, valid while the file is open
  size_t nbytes = 0;

  int64_t numel() const;
  std::string describe() const;  // "name: e4m3[576, 256] in model.safetensors"
  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(data);
  }
};

// A safetensors file's tensors (data pointing into the bytes parsed) and __metadata__.
struct SafetensorsHeader {
  std::map<std::string, TensorView> tensors;
  std::map<std::string, std::string> metadata;
};

// Parses a whole safetensors file held in `size` bytes at `base` (the 8-byte header length, the
// JSON header, the data): every entry is checked against `size`. Throws Error naming `path`.
SafetensorsHeader parse_safetensors(const std::byte* base, size_t size, const std::string& path);

// The shard files model.safetensors.index.json names (its weight_map's values), each once, in
// first-seen order. Throws Error naming `source` when it is not such an index.
std::vector<std::string> parse_safetensors_index(const std::string& json_text,
                                                 const std::string& source);

// One mmap'd .safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Drops the whole pages of [data, data + nbytes) (inside this file's mapping, else nothing)
  // from the process's resident set; a later read maps them again from the page cache.
  void release(const std::byte* data, size_t nbytes) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint folder: every tensor by name across its shards.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);
  // The same checkpoint, except that each tensor named in `moved` reads its bytes from the given
  // address (the same dtype, shape and bytes: a copy the caller made, e.g. the distributed loader's
  // gathered replicated tensors). `base` stays alive with it (its mmap holds the other tensors),
  // and so does `owner` (the memory of the copies).
  Checkpoint(std::shared_ptr<const Checkpoint> base,
             const std::map<std::string, const std::byte*>& moved,
             std::shared_ptr<const void> owner);

  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // The tensor, or an Error naming it and the folder (and what to check).
  const TensorView& get(const std::string& name) const;
  // get() plus a dtype and shape check that names the tensor and both shapes.
  const TensorView& get(const std::string& name, DType dtype,
                        const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;
  size_t total_bytes() const;
  // The tensor's mapped pages leave the resident set (SafetensorsFile::release): for tensors the
  // runtime keeps in another form (the fp8 weights' decode layout), so they are not held twice.
  // Nothing for a moved tensor (its memory is the caller's copy).
  void release(const std::string& name) const;
  // The same for part of a tensor: the whole pages of [data, data + nbytes) in whichever file maps
  // them (nothing where none does).
  void release(const void* data, size_t nbytes) const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
  std::shared_ptr<const Checkpoint> base_;   // a moved copy's original
  std::map<std::string, TensorView> moved_;  // its tensors that read elsewhere
  std::shared_ptr<const void> moved_owner_;  // their memory
};

// Writes a safetensors file (tests and the synthetic-model tool use it).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

const char* safetensors_dtype_name(DType dtype);

// What to do about a safetensors dtype deepinfer does not read (e.g. F16: convert to BF16).
std::string unsupported_dtype_hint(const std::string& dtype);

// "tensor NAME in FILE is BF16[2048, 256], but config.json implies BF16[2048, 512]: ..."
std::string mismatch_message(const TensorView& t, DType dtype, const std::vector<int64_t>& shape);

}  // namespace deepinfer::model
