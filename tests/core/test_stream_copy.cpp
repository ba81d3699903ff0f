// copy_streaming against memcpy: every length up to a few lines, at every alignment of source and
// destination (the 16-byte head, the 64-byte body, the 16-byte and byte tails).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "core/stream_copy.h"

namespace deepinfer {
namespace {

TEST(StreamCopy, MatchesMemcpyAtEveryLengthAndAlignment) {
  std::vector<std::byte> src(400), dst(400), want(400);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::byte(i * 37 + 11);
  for (size_t s_off = 0; s_off < 16; s_off += 3)
    for (size_t d_off = 0; d_off < 17; ++d_off)
      for (size_t n = 0; n <= 300; ++n) {
        std::fill(dst.begin(), dst.end(), std::byte{0xee});
        want = dst;
        std::memcpy(want.data() + d_off, src.data() + s_off, n);
        copy_streaming(dst.data() + d_off, src.data() + s_off, n);
        streaming_fence();
        ASSERT_EQ(dst, want) << "n=" << n << " src+" << s_off << " dst+" << d_off;
      }
}

}  // namespace
}  // namespace deepinfer
