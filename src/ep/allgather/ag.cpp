#include "ep/allgather/ag.h"

#include <algorithm>
#include <cstring>

namespace deepinfer::ep::ag {

void gather(Group& group, const std::byte* send, int64_t rows, size_t rec_bytes, std::byte* recv,
            EpCallStats& stats) {
  const size_t block = size_t(rows) * rec_bytes;
  group.all_gather(send, recv, block, DType::u8);
  stats.bytes_sent += block;
  stats.bytes_recv += block * size_t(group.size());
  stats.collectives += 1;
  stats.lowering = "ag";
}

void select(const std::byte* gathered, int world, int64_t rows, const RecordLayout& rec, int k,
            int64_t lo, int64_t hi, std::vector<int64_t>& out) {
  out.clear();
  const int64_t total = int64_t(world) * rows;
  for (int64_t i = 0; i < total; ++i) {
    const std::byte* idx = gathered + size_t(i) * rec.bytes + rec.off_idx;
    for (int j = 0; j < k; ++j) {
      int64_t e;
      std::memcpy(&e, idx + size_t(j) * 8, 8);
      if (e >= lo && e < hi) {
        out.push_back(i);
        break;
      }
    }
  }
}

void reduce(Group& group, const ReduceParams& p, const FillFn& fill, const ConsumeFn& consume,
            std::vector<float>& send_buf, std::vector<float>& recv_buf, EpCallStats& stats) {
  const size_t w = size_t(group.size());
  const int me = group.rank();
  // Every rank runs the same number of chunks: R and chunk_rows agree across ranks.
  for (int64_t begin = 0; begin < p.rows; begin += int64_t(p.chunk_rows)) {
    const int64_t end = std::min<int64_t>(p.rows, begin + int64_t(p.chunk_rows));
    const size_t block = size_t(end - begin) * p.cols;  // floats per rank
    if (send_buf.size() < w * block) send_buf.resize(w * block);
    fill(begin, end, send_buf.data());
    if (p.reduce == EpReduce::rs) {
      if (recv_buf.size() < block) recv_buf.resize(block);
      group.reduce_scatter(send_buf.data(), recv_buf.data(), block);
      stats.bytes_recv += block * 4;
      consume(begin, end, recv_buf.data());
    } else {
      group.all_reduce(send_buf.data(), w * block, DType::f32, ReduceOp::sum);
      stats.bytes_recv += w * block * 4;
      consume(begin, end, send_buf.data() + size_t(me) * block);
    }
    stats.bytes_sent += w * block * 4;
    stats.collectives += 1;
  }
}

}  // namespace deepinfer::ep::ag
