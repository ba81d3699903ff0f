// `faulty`: wraps another Group and injects one named fault, to prove the conformance suite
// catches such bugs and that EPBuffer's `auto` routes around what capabilities() distrusts.
#pragma once

#include <deepinfer/comm.h>

#include <memory>
#include <string>

namespace deepinfer::comm {

// Collective call (0-based, counted per rank) in which `rank-exit` kills the highest rank.
constexpr int kRankExitCall = 1;
// On mpi the dead rank exits this long after the peers' deadline (they abort the job first).
constexpr double kRankExitLingerSeconds = 3.0;
// int32-ag-corrupt fires on all_gather outputs of at least this many bytes at >= this many ranks.
constexpr size_t kAgCorruptMinBytes = size_t(1) << 20;
constexpr int kAgCorruptMinWorld = 16;
// a2av-hang fires on uneven all_to_all_v at >= this many ranks.
constexpr int kA2avHangMinWorld = 4;

// Throws Error listing the known fault names when `name` is not one of them.
void check_fault_name(const std::string& name);

// The smallest world size at which fault `name` acts; below it the wrapped group behaves
// correctly, so a suite meant to catch the fault would pass. Throws like check_fault_name.
int fault_min_world(const std::string& name);

// Throws Error listing the known names when `fault` is unknown. timeout_s is the run's
// collective deadline (the hang honours it, so the process still exits).
std::unique_ptr<Group> make_faulty_group(std::unique_ptr<Group> inner, const std::string& fault,
                                         double timeout_s);

}  // namespace deepinfer::comm
