// EPConfig validation and its agreement across ranks, its knobs, the enums' words and the `auto`
// algorithm rule.
#include <deepinfer/ep.h>
#include <fmt/format.h>

#include <array>

#include "core/check.h"
#include "core/env.h"
#include "ep/validate.h"

namespace deepinfer {
namespace {

// The enum value whose word is the (validated) knob value.
template <class E, size_t N>
E from_word(const char* knob, const std::string& word, const std::array<E, N>& all) {
  for (E e : all)
    if (to_string(e) == word) return e;
  DI_FAIL(
      "{}='{}' has no EP meaning (internal: the knob's allowed words and the ep layer disagree)",
      knob, word);
}

}  // namespace

std::string_view to_string(EpAlgo v) {
  switch (v) {
    case EpAlgo::ag:
      return "ag";
    case EpAlgo::a2a:
      return "a2a";
    case EpAlgo::automatic:
      return "auto";
  }
  return "?";
}
std::string_view to_string(AgRows v) { return v == AgRows::max ? "max" : "cap"; }
std::string_view to_string(EpReduce v) { return v == EpReduce::rs ? "rs" : "ar"; }
std::string_view to_string(CombineMode v) { return v == CombineMode::exact ? "exact" : "fast"; }
std::string_view to_string(EpPeerMemory v) {
  return v == EpPeerMemory::on ? "on" : v == EpPeerMemory::off ? "off" : "auto";
}

EPConfig EPConfig::from_knobs() {
  const Knobs& k = knobs();
  EPConfig c;
  c.algo = from_word("DEEPINFER_EP_ALGO", k.ep_algo,
                     std::array{EpAlgo::ag, EpAlgo::a2a, EpAlgo::automatic});
  c.combine = from_word("DEEPINFER_EP_COMBINE", k.ep_combine,
                        std::array{CombineMode::exact, CombineMode::fast});
  c.ag_rows = from_word("DEEPINFER_EP_AG_ROWS", k.ep_ag_rows, std::array{AgRows::max, AgRows::cap});
  c.reduce = from_word("DEEPINFER_EP_REDUCE", k.ep_reduce, std::array{EpReduce::rs, EpReduce::ar});
  c.chunk_bytes = k.ep_chunk_bytes;
  c.peer_memory =
      from_word("DEEPINFER_EP_PEER_MEMORY", k.ep_peer_memory,
                std::array{EpPeerMemory::off, EpPeerMemory::on, EpPeerMemory::automatic});
  return c;
}

// A bad field is the caller's mistake (an Error naming it, never an InternalError).
void EPConfig::validate(int world) const {
  if (world < 1) DI_FAIL("EPConfig: group size must be >= 1, got {}", world);
  if (num_experts < 1) DI_FAIL("EPConfig.num_experts must be >= 1, got {}", num_experts);
  if (num_experts % world != 0)
    DI_FAIL(
        "EPConfig.num_experts = {} is not a multiple of the group size {}; experts are split "
        "evenly across ranks (E % W == 0)",
        num_experts, world);
  if (num_experts / world > kEpMaxLocalExperts)
    DI_FAIL("EPConfig.num_experts = {} gives {} local experts per rank; at most {} supported",
            num_experts, num_experts / world, kEpMaxLocalExperts);
  if (hidden < 1) DI_FAIL("EPConfig.hidden must be >= 1, got {}", hidden);
  if (num_topk < 1 || num_topk > kEpMaxTopk)
    DI_FAIL("EPConfig.num_topk must be in [1, {}], got {}", kEpMaxTopk, num_topk);
  if (num_topk > num_experts)
    DI_FAIL("EPConfig.num_topk = {} exceeds num_experts = {} (experts in a row must be distinct)",
            num_topk, num_experts);
  if (num_max_tokens_per_rank < 0)
    DI_FAIL("EPConfig.num_max_tokens_per_rank must be >= 0, got {}", num_max_tokens_per_rank);
  if (int64_t(num_max_tokens_per_rank) * world >= (int64_t(1) << 40))
    DI_FAIL("EPConfig.num_max_tokens_per_rank = {} × {} ranks is too large",
            num_max_tokens_per_rank, world);
  if (expert_alignment < 1 || expert_alignment > (1 << 20))
    DI_FAIL("EPConfig.expert_alignment must be in [1, 2^20], got {}", expert_alignment);
  if (chunk_bytes < 4096) DI_FAIL("EPConfig.chunk_bytes must be >= 4096, got {}", chunk_bytes);
  if (dispatch_dtype != DispatchDType::bf16 && dispatch_dtype != DispatchDType::fp8)
    DI_FAIL("EPConfig.dispatch_dtype must be bf16 or fp8, got the value {}", int(dispatch_dtype));
  // The enums come from the caller as any byte: one outside its values would pick no lowering.
  const auto bad_enum = [](const char* field, int v, const char* words) {
    DI_FAIL("EPConfig.{} must be one of {}, got the value {}", field, words, v);
  };
  if (algo != EpAlgo::ag && algo != EpAlgo::a2a && algo != EpAlgo::automatic)
    bad_enum("algo", int(algo), "ag, a2a, automatic");
  if (combine != CombineMode::exact && combine != CombineMode::fast)
    bad_enum("combine", int(combine), "exact, fast");
  if (ag_rows != AgRows::max && ag_rows != AgRows::cap)
    bad_enum("ag_rows", int(ag_rows), "max, cap");
  if (reduce != EpReduce::rs && reduce != EpReduce::ar) bad_enum("reduce", int(reduce), "rs, ar");
  if (peer_memory != EpPeerMemory::off && peer_memory != EpPeerMemory::on &&
      peer_memory != EpPeerMemory::automatic)
    bad_enum("peer_memory", int(peer_memory), "off, on, automatic");
}

std::string EPConfig::describe() const {
  return fmt::format(
      "E={} H={} K={} M={} dtype={} align={} expand={} algo={} combine={} ag_rows={} reduce={} "
      "chunk={} peer_memory={}",
      num_experts, hidden, num_topk, num_max_tokens_per_rank,
      dispatch_dtype == DispatchDType::fp8 ? "fp8" : "bf16", expert_alignment, expand ? 1 : 0,
      to_string(algo), to_string(combine), to_string(ag_rows), to_string(reduce), chunk_bytes,
      to_string(peer_memory));
}

EpAlgo resolve_ep_algo(EpAlgo requested, const Capabilities& caps) {
  if (requested != EpAlgo::automatic) return requested;
  return caps.all_to_all_v ? EpAlgo::a2a : EpAlgo::ag;
}

void ep::agree_on_config(Group& group, const EPConfig& config, EpAlgo algo,
                         const std::string& local_error) {
  const int rank = group.rank(), world = group.size();
  const std::array<std::pair<const char*, int64_t>, 12> fields{{
      {"(a rank's config is invalid)", local_error.empty() ? 0 : 1},
      {"num_experts", config.num_experts},
      {"hidden", config.hidden},
      {"num_topk", config.num_topk},
      {"num_max_tokens_per_rank", config.num_max_tokens_per_rank},
      {"dispatch_dtype", int64_t(config.dispatch_dtype)},
      {"expert_alignment", config.expert_alignment},
      {"expand", config.expand},
      {"algo (resolved)", int64_t(algo)},
      {"combine", int64_t(config.combine)},
      {"ag_rows/reduce", int64_t(config.ag_rows) * 2 + int64_t(config.reduce)},
      {"peer_memory", int64_t(config.peer_memory)},
  }};
  std::array<int64_t, 2 * fields.size()> v{};
  for (size_t i = 0; i < fields.size(); ++i) {
    v[2 * i] = fields[i].second;
    v[2 * i + 1] = -fields[i].second;
  }
  group.all_reduce(v.data(), v.size(), DType::i64, ReduceOp::max);
  if (!local_error.empty()) DI_FAIL("EPBuffer on rank {}/{}: {}", rank, world, local_error);
  if (v[0] != 0)
    DI_FAIL("EPBuffer on rank {}/{}: another rank's EPConfig is invalid (see its error)", rank,
            world);
  for (size_t i = 1; i < fields.size(); ++i)
    if (v[2 * i] != -v[2 * i + 1])
      DI_FAIL(
          "EPBuffer on rank {}/{}: EPConfig.{} differs across ranks (min {}, max {}); every rank "
          "must construct the EPBuffer with the same value",
          rank, world, fields[i].first, -v[2 * i + 1], v[2 * i]);
}

}  // namespace deepinfer
