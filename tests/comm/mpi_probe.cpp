// Failure probes for the `mpi` backend, run by ctest under mpirun; each must end the job
// (non-zero) with the named message instead of hanging. Usage: comm_mpi_probe CASE
//   skip        rank 1 never calls the barrier: the others time out (1 s deadline)
//   rank-exit   the `rank-exit` fault: the highest rank dies mid-collective
//   a2av-hang   the `a2av-hang` fault (needs >= 4 ranks)
//   world4      --world 4 given, whatever mpirun started
#include <deepinfer/comm.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  using namespace deepinfer;
  const std::string what = argc > 1 ? argv[1] : "";
  LaunchOptions o;
  o.comm = CommKind::mpi;
  o.world = what == "world4" ? 4 : 0;
  o.timeout_s = 1.0;
  if (what == "rank-exit" || what == "a2av-hang") o.fault = what;
  try {
    run_ranks(o, [&](Group& g) {
      if (what == "skip") {
        if (g.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
        g.barrier();
      } else if (what == "rank-exit") {
        std::vector<int> s(10, g.rank()), r(10 * size_t(g.size()));
        g.barrier();
        g.all_gather(s.data(), r.data(), 10, DType::i32);
      } else if (what == "a2av-hang") {
        const size_t n = size_t(g.size());
        std::vector<size_t> sc(n), rc(n);
        for (size_t j = 0; j < n; ++j) {
          sc[j] = j + 1;
          rc[j] = size_t(g.rank()) + 1;
        }
        std::vector<int> s(n * (n + 1)), r(n * n);
        g.all_to_all_v(s.data(), sc, r.data(), rc, DType::i32);
      }
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "probe error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "probe %s: finished without an error\n", what.c_str());
  return 0;
}
