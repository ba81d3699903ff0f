// `mpi` backend: one process per rank under mpirun/srun (OpenMPI). Every collective is the
// non-blocking MPI call, polled with MPI_Test against the deadline, so a dead or hung peer
// becomes a CommTimeout instead of a hang. Payloads that are not reduced move as MPI_BYTE;
// counts beyond INT_MAX use derived datatypes or point-to-point transfers.
#pragma once

#include <deepinfer/comm.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "comm/common.h"

namespace deepinfer::comm {

// Initialises MPI once per process (MPI_THREAD_SERIALIZED) and finalises it at exit.
void mpi_init_once();
// Largest int count a single MPI call is given; tests lower it to exercise the > INT_MAX paths
// with small buffers. 0 restores kMpiMaxCount.
void set_mpi_count_limit_for_testing(size_t limit);

class MpiGroup final : public Group {
 public:
  explicit MpiGroup(double timeout_s);  // duplicates MPI_COMM_WORLD
  ~MpiGroup() override;
  MpiGroup(const MpiGroup&) = delete;
  MpiGroup& operator=(const MpiGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  // MPI picks its own reduction order, so reduce_scatter is not bit-reproducible across sizes.
  Capabilities capabilities() const override { return {true, true, true}; }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override;
  void all_gather_v(const void* send, size_t send_count, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override;
  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  void reduce_scatter(const float* send, float* recv, size_t count) override;
  void all_to_all(const void* send, void* recv, size_t count, DType dtype) override;
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override;
  void all_to_all_v_rows(const void* base, size_t row_bytes, std::span<const int64_t> rows,
                         std::span<const int64_t> offsets, void* recv,
                         std::span<const size_t> recv_rows) override;
  void broadcast(void* buf, size_t count, DType dtype, int root) override;
  void barrier() override;
  // Every rank on one host: a shared window (MPI_Win_allocate_shared over the node), grown on
  // demand, that expose() copies each rank's regions into.
  PeerMemory peer_memory() const override {
    return node_comm_ != MPI_COMM_NULL ? PeerMemory::window : PeerMemory::none;
  }
  void expose(std::span<const std::span<const std::byte>> regions,
              std::vector<const std::byte*>& peers) override;
  // The peers write the regions' copies in the window; the next barrier() copies them back (where
  // a region was not built in the window already).
  void expose_writable(std::span<const std::span<std::byte>> regions,
                       std::vector<std::byte*>& peers) override;
  std::byte* expose_staging(size_t bytes) override;

  // A collective timed out (its requests are still pending): the job must be aborted.
  bool broken() const { return broken_; }

 private:
  struct Call {
    OpKind op;
    size_t bytes;
    Clock::time_point deadline;
  };
  Call begin(OpKind op, size_t bytes);
  void wait(const Call& call, std::vector<MPI_Request>& reqs);
  void wait(const Call& call, MPI_Request req);
  bool any_rank_needs(const Call& call, bool local_flag);  // consensus for the big-count paths
  void p2p_exchange(const Call& call, const std::byte* send, const std::vector<size_t>& send_bytes,
                    const std::vector<size_t>& send_offsets, std::byte* recv,
                    const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offsets);

  void free_window();
  // expose and expose_writable: copies the regions into this rank's slot of the window (grown as
  // needed) and returns where every rank's regions are there.
  void expose_in_window(std::span<const std::span<const std::byte>> regions,
                        std::vector<std::byte*>& peers);

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm node_comm_ = MPI_COMM_NULL;  // = comm_'s ranks, where they all share this host
  MPI_Win window_ = MPI_WIN_NULL;
  size_t window_bytes_ = 0;            // per rank
  std::vector<std::byte*> window_at_;  // rank r's block, mapped here
  // Open writable exposure (every rank alike): the next barrier() syncs the window and copies
  // `copy_back` (window copy -> region) once every peer's writes have landed.
  bool writable_open_ = false;
  std::vector<std::span<std::byte>> copy_back_from_, copy_back_to_;
  int rank_ = 0;
  int size_ = 1;
  double timeout_s_;
  double spin_s_;  // busy-poll time before yielding; short when ranks outnumber cores
  bool broken_ = false;
  std::string broken_reason_;
};

}  // namespace deepinfer::comm
