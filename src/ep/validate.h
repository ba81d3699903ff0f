// Input checks: the local ones shared by layout() and dispatch() each return "" or a message
// naming the problem and the fix; the config agreement is collective.
#pragma once

#include <deepinfer/ep.h>

#include <string>

namespace deepinfer::ep {

std::string check_topk_idx(const Tensor& topk_idx, const EPConfig& cfg);
std::string check_dispatch_input(const DispatchInput& in, const EPConfig& cfg);
std::string check_x(const Tensor& x, const Tensor& scales, int64_t num_tokens, const EPConfig& cfg);

// Collective, at EPBuffer construction: one MAX all_reduce of (v, -v) pairs tells every rank the
// min and max of each field, so a config that is invalid on any rank (`local_error` non-empty
// here) or differs between ranks is an Error on every rank, naming the field. `algo` is the
// resolved algorithm.
void agree_on_config(Group& group, const EPConfig& config, EpAlgo algo,
                     const std::string& local_error);

}  // namespace deepinfer::ep
