// Local input checks shared by layout() and dispatch(): each returns "" or a message naming the
// problem and the fix.
#pragma once

#include <deepinfer/ep.h>

#include <string>

namespace deepinfer::ep {

std::string check_topk_idx(const Tensor& topk_idx, const EPConfig& cfg);
std::string check_dispatch_input(const DispatchInput& in, const EPConfig& cfg);
std::string check_x(const Tensor& x, const Tensor& scales, int64_t num_tokens, const EPConfig& cfg);

}  // namespace deepinfer::ep
