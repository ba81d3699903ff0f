// Flat byte encoding of plain values and vectors, for messages that travel through a collective
// (gathered results, the server's step plans and events). Both sides run the same build, so the
// layout is the host's; a short or corrupt payload is an Error, never a read past the end.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/check.h"

namespace deepinfer {

struct ByteWriter {
  std::vector<uint8_t> bytes;
  template <class T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    pod(uint64_t(v.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    bytes.insert(bytes.end(), p, p + v.size() * sizeof(T));
  }
  void str(const std::string& s) {
    pod(uint64_t(s.size()));
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
};

struct ByteReader {
  const uint8_t* p;
  const uint8_t* end;
  ByteReader(const uint8_t* data, size_t n) : p(data), end(data + n) {}
  bool done() const { return p == end; }
  template <class T>
  T pod() {
    DI_CHECK(size_t(end - p) >= sizeof(T), "byte message: truncated payload");
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> vec() {
    const auto n = pod<uint64_t>();
    DI_CHECK(n <= size_t(end - p) / sizeof(T), "byte message: truncated payload");
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), p, n * sizeof(T));
    p += n * sizeof(T);
    return v;
  }
  std::string str() {
    const auto n = pod<uint64_t>();
    DI_CHECK(n <= size_t(end - p), "byte message: truncated payload");
    std::string s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
};

}  // namespace deepinfer
