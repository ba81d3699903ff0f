// fault_min_world: below it every fault leaves the conformance suite passing, from it on the
// suite fails. `check collectives --fault` refuses sizes below it, where the run would pass.
#include <deepinfer/comm.h>
#include <gtest/gtest.h>

#include <string>

#include "comm/conformance/conformance.h"
#include "comm/faulty/faulty_group.h"

namespace deepinfer {
namespace {

bool suite_passes(const std::string& fault, int world) {
  LaunchOptions lo;
  lo.world = world;
  lo.fault = fault;
  lo.timeout_s = 1;
  std::vector<conformance::SuiteReport> reports(static_cast<size_t>(world));
  try {
    run_ranks(lo, [&](Group& g) {
      auto& r = reports[size_t(g.rank())] =
          conformance::run_suite(g, {conformance::Coverage::quick});
      if (r.stop.stopped) std::rethrow_exception(r.stop.error);
    });
  } catch (const std::exception&) {
    return false;  // a rank died or timed out: the suite fails
  }
  for (const auto& r : reports)
    if (!r.ok()) return false;
  return true;
}

TEST(FaultSizes, EachFaultActsFromItsMinimumWorldOn) {
  for (const auto& [name, help] : fault_names()) {
    const std::string fault(name);
    const int min_world = comm::fault_min_world(fault);
    ASSERT_GE(min_world, 1) << fault;
    if (min_world > 1) {
      EXPECT_TRUE(suite_passes(fault, min_world - 1)) << fault << " at " << min_world - 1;
    }
    EXPECT_FALSE(suite_passes(fault, min_world)) << fault << " at " << min_world;
  }
}

TEST(FaultSizes, UnknownFaultIsAnError) {
  EXPECT_THROW(comm::fault_min_world("no-such-fault"), Error);
}

}  // namespace
}  // namespace deepinfer
