#include "model/config.h"

#include <deepinfer/error.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "kernels/engram.h"

namespace deepinfer::model {

namespace {

using nlohmann::json;

struct Reader {
  const json& j;
  const std::string& source;
  std::string prefix = {};  // "engram." for the fields of a nested object

  [[noreturn]] void bad(const std::string& field, const std::string& why) const {
    DI_FAIL("{}: field '{}{}' {}", source, prefix, field, why);
  }
  bool has(const char* f) const { return j.contains(f) && !j[f].is_null(); }
  int64_t integer(const char* f) const {
    if (!has(f)) bad(f, "is missing (required by the DeepSeek architecture)");
    if (!j[f].is_number_integer()) bad(f, "must be an integer, got " + j[f].dump());
    return j[f].get<int64_t>();
  }
  int64_t integer_or(const char* f, int64_t def) const { return has(f) ? integer(f) : def; }
  double number(const char* f) const {
    if (!has(f)) bad(f, "is missing (required by the DeepSeek architecture)");
    if (!j[f].is_number()) bad(f, "must be a number, got " + j[f].dump());
    return j[f].get<double>();
  }
  double number_or(const char* f, double def) const { return has(f) ? number(f) : def; }
  bool boolean_or(const char* f, bool def) const {
    if (!has(f)) return def;
    if (!j[f].is_boolean()) bad(f, "must be true or false, got " + j[f].dump());
    return j[f].get<bool>();
  }
  std::string string_or(const char* f, const std::string& def) const {
    if (!has(f)) return def;
    if (!j[f].is_string()) bad(f, "must be a string, got " + j[f].dump());
    return j[f].get<std::string>();
  }
  void positive(const char* f, int64_t v) const {
    if (v <= 0) bad(f, "must be positive, got " + std::to_string(v));
  }
  std::vector<int64_t> integers(const char* f) const {
    if (!has(f)) bad(f, "is missing");
    if (!j[f].is_array()) bad(f, "must be a list of integers, got " + j[f].dump());
    std::vector<int64_t> v;
    for (const json& e : j[f]) {
      if (!e.is_number_integer()) bad(f, "must be a list of integers, got " + j[f].dump());
      v.push_back(e.get<int64_t>());
    }
    return v;
  }
};

// The `engram` object: every key required, no others (a typo must not silently disable a part).
EngramModelConfig parse_engram(const json& e, const std::string& source, const ModelConfig& c) {
  Reader r{e, source, "engram."};
  if (!e.is_object()) DI_FAIL("{}: field 'engram' must be an object or absent", source);
  static constexpr const char* kKeys[] = {
      "layer_ids",         "max_ngram_size", "n_head_per_ngram", "n_embed_per_ngram",
      "engram_vocab_size", "kernel_size",    "pad_id",           "seed"};
  for (const auto& [key, value] : e.items())
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys))
      DI_FAIL(
          "{}: field 'engram.{}' is not an Engram setting (allowed: layer_ids, max_ngram_size, "
          "n_head_per_ngram, n_embed_per_ngram, engram_vocab_size, kernel_size, pad_id, seed)",
          source, key);
  EngramModelConfig g;
  g.layer_ids = r.integers("layer_ids");
  g.max_ngram_size = r.integer("max_ngram_size");
  g.n_head_per_ngram = r.integer("n_head_per_ngram");
  g.n_embed_per_ngram = r.integer("n_embed_per_ngram");
  g.engram_vocab_size = r.integers("engram_vocab_size");
  g.kernel_size = r.integer("kernel_size");
  g.pad_id = r.integer("pad_id");
  g.seed = r.integer("seed");
  // The hash's own checks (orders, heads, budgets, seed), then what the model adds.
  kernels::EngramHashConfig h;
  h.layer_ids = g.layer_ids;
  h.max_ngram_size = g.max_ngram_size;
  h.n_head_per_ngram = g.n_head_per_ngram;
  h.engram_vocab_size = g.engram_vocab_size;
  h.seed = g.seed;
  h.vocab_size = 1;  // the compressed vocabulary is known once the tokenizer is read
  try {
    h.validate();
  } catch (const Error& err) {
    DI_FAIL("{}: {}", source, err.what());
  }
  for (size_t i = 0; i < g.layer_ids.size(); ++i) {
    const int64_t l = g.layer_ids[i];
    if (l >= c.num_hidden_layers)
      r.bad("layer_ids", fmt::format("holds {}, outside the blocks [0, num_hidden_layers = {})", l,
                                     c.num_hidden_layers));
    if (i > 0 && l <= g.layer_ids[i - 1])
      r.bad("layer_ids", "must be strictly increasing, got " + e["layer_ids"].dump());
  }
  if (g.max_ngram_size > 16)
    r.bad("max_ngram_size", fmt::format("must be at most 16, got {}", g.max_ngram_size));
  r.positive("n_embed_per_ngram", g.n_embed_per_ngram);
  if (g.n_head_per_ngram > 1024)
    r.bad("n_head_per_ngram", fmt::format("must be at most 1024, got {}", g.n_head_per_ngram));
  if (g.n_embed_per_ngram > (int64_t(1) << 20))
    r.bad("n_embed_per_ngram", fmt::format("must be at most 2^20, got {}", g.n_embed_per_ngram));
  if (g.n_embed_per_ngram % g.n_head_per_ngram)
    r.bad("n_embed_per_ngram",
          fmt::format("({}) must be a multiple of n_head_per_ngram ({}): each head's table row is "
                      "n_embed_per_ngram / n_head_per_ngram wide",
                      g.n_embed_per_ngram, g.n_head_per_ngram));
  if (g.kernel_size < 1 || g.kernel_size > 64)
    r.bad("kernel_size", fmt::format("must be in [1, 64], got {}", g.kernel_size));
  if (g.pad_id < 0 || g.pad_id >= c.vocab_size)
    r.bad("pad_id",
          fmt::format("({}) must be a token id in [0, vocab_size = {})", g.pad_id, c.vocab_size));
  if (g.seed > (int64_t(1) << 40))
    r.bad("seed", fmt::format("must be at most 2^40, got {}", g.seed));
  return g;
}

}  // namespace

int64_t EngramModelConfig::index_of(int64_t layer) const {
  const auto it = std::find(layer_ids.begin(), layer_ids.end(), layer);
  return it == layer_ids.end() ? -1 : int64_t(it - layer_ids.begin());
}

double ModelConfig::yarn_mscale(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

double ModelConfig::softmax_scale() const {
  double s = 1.0 / std::sqrt(double(qk_head_dim()));
  if (rope_scaling.enabled) {
    const double m = yarn_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    s *= m * m;
  }
  return s;
}

std::string ModelConfig::summary() const {
  return fmt::format(
      "{}: {} layers ({} dense), hidden {}, {} heads (nope/rope/v {}/{}/{}), q_lora {}, kv_lora "
      "{}, "
      "{} routed experts top-{} in {} groups (topk_group {}), {} shared, vocab {}, {} "
      "weights{}{}{}",
      model_type, num_hidden_layers, std::min(first_k_dense_replace, num_hidden_layers),
      hidden_size, num_attention_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, q_lora_rank,
      kv_lora_rank, n_routed_experts, num_experts_per_tok, n_group, topk_group, n_shared_experts,
      vocab_size, fp8_weights ? "fp8" : "bf16",
      rope_scaling.enabled ? fmt::format(", yarn x{}", rope_scaling.factor) : "",
      hc_mult > 1 ? fmt::format(", mHC x{}", hc_mult) : "",
      engram.enabled() ? fmt::format(", Engram in blocks {}", fmt::join(engram.layer_ids, ","))
                       : "");
}

ModelConfig parse_config(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    DI_FAIL("{}: not valid JSON ({})", source, e.what());
  }
  if (!j.is_object()) DI_FAIL("{}: expected a JSON object at the top level", source);
  Reader r{j, source};
  ModelConfig c;
  c.model_type = r.string_or("model_type", "");
  if (c.model_type != "deepseek_v3" && c.model_type != "deepseek_v2")
    r.bad("model_type",
          "is '" + c.model_type + "'; deepinfer runs deepseek_v3 and deepseek_v2 checkpoints");
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  c.kv_lora_rank = r.integer("kv_lora_rank");
  c.qk_nope_head_dim = r.integer("qk_nope_head_dim");
  c.qk_rope_head_dim = r.integer("qk_rope_head_dim");
  c.v_head_dim = r.integer("v_head_dim");
  c.q_lora_rank = r.integer_or("q_lora_rank", 0);
  c.n_routed_experts = r.integer_or("n_routed_experts", 0);
  c.n_shared_experts = r.integer_or("n_shared_experts", 0);
  c.first_k_dense_replace = r.integer_or("first_k_dense_replace", 0);
  c.moe_layer_freq = r.integer_or("moe_layer_freq", 1);
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.rope_theta = r.number_or("rope_theta", 10000.0);
  c.max_position_embeddings = r.integer_or("max_position_embeddings", 4096);
  c.num_nextn_predict_layers = r.integer_or("num_nextn_predict_layers", 0);
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.bos_token_id = r.integer_or("bos_token_id", -1);
  c.eos_token_id = r.integer_or("eos_token_id", -1);

  for (auto [f, v] : {std::pair{"vocab_size", c.vocab_size},
                      {"hidden_size", c.hidden_size},
                      {"intermediate_size", c.intermediate_size},
                      {"num_hidden_layers", c.num_hidden_layers},
                      {"num_attention_heads", c.num_attention_heads},
                      {"kv_lora_rank", c.kv_lora_rank},
                      {"qk_nope_head_dim", c.qk_nope_head_dim},
                      {"qk_rope_head_dim", c.qk_rope_head_dim},
                      {"v_head_dim", c.v_head_dim},
                      {"max_position_embeddings", c.max_position_embeddings}})
    r.positive(f, v);
  if (c.q_lora_rank < 0) r.bad("q_lora_rank", "must be >= 0 (0 or null = direct q_proj)");
  if (c.qk_rope_head_dim % 2) r.bad("qk_rope_head_dim", "must be even (RoPE rotates pairs)");
  if (c.moe_layer_freq <= 0) r.bad("moe_layer_freq", "must be positive");
  const std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu") r.bad("hidden_act", "is '" + act + "'; only silu (SwiGLU) is supported");
  if (r.boolean_or("attention_bias", false))
    r.bad("attention_bias", "must be false (DeepSeek MLA has no biases)");

  if (c.n_routed_experts > 0) {
    c.moe_intermediate_size = r.integer("moe_intermediate_size");
    r.positive("moe_intermediate_size", c.moe_intermediate_size);
    c.num_experts_per_tok = r.integer("num_experts_per_tok");
    c.n_group = r.integer_or("n_group", 1);
    c.topk_group = r.integer_or("topk_group", 1);
    c.norm_topk_prob = r.boolean_or("norm_topk_prob", c.model_type == "deepseek_v3");
    c.routed_scaling_factor = r.number_or("routed_scaling_factor", 1.0);
    const std::string method =
        r.string_or("topk_method", c.model_type == "deepseek_v3" ? "noaux_tc" : "greedy");
    if (method == "noaux_tc")
      c.topk_method = TopkMethod::noaux_tc;
    else if (method == "greedy")
      c.topk_method = TopkMethod::greedy;
    else if (method == "group_limited_greedy")
      c.topk_method = TopkMethod::group_limited_greedy;
    else
      r.bad("topk_method", "is '" + method + "'; allowed: noaux_tc, greedy, group_limited_greedy");
    const std::string scoring =
        r.string_or("scoring_func", c.topk_method == TopkMethod::noaux_tc ? "sigmoid" : "softmax");
    if (scoring == "sigmoid")
      c.scoring_func = ScoringFunc::sigmoid;
    else if (scoring == "softmax")
      c.scoring_func = ScoringFunc::softmax;
    else
      r.bad("scoring_func", "is '" + scoring + "'; allowed: sigmoid, softmax");
    if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.n_routed_experts)
      r.bad("num_experts_per_tok", fmt::format("must be in [1, n_routed_experts = {}], got {}",
                                               c.n_routed_experts, c.num_experts_per_tok));
    if (c.n_group <= 0 || c.n_routed_experts % c.n_group)
      r.bad("n_group", fmt::format("must divide n_routed_experts = {}, got {}", c.n_routed_experts,
                                   c.n_group));
    if (c.topk_group <= 0 || c.topk_group > c.n_group)
      r.bad("topk_group",
            fmt::format("must be in [1, n_group = {}], got {}", c.n_group, c.topk_group));
    if (c.topk_method == TopkMethod::noaux_tc && c.n_routed_experts / c.n_group < 2)
      r.bad("n_group",
            "noaux_tc scores a group by its top-2 experts, so each group needs >= 2 experts");
    if (c.num_experts_per_tok > c.topk_group * (c.n_routed_experts / c.n_group))
      r.bad("num_experts_per_tok", "exceeds the experts available in topk_group groups");
  }

  if (r.has("rope_scaling")) {
    const json& rs = j["rope_scaling"];
    if (!rs.is_object()) r.bad("rope_scaling", "must be an object or null");
    Reader s{rs, source};
    std::string type = s.string_or("type", s.string_or("rope_type", ""));
    if (type != "yarn") r.bad("rope_scaling.type", "is '" + type + "'; only yarn is supported");
    c.rope_scaling.enabled = true;
    c.rope_scaling.factor = s.number("factor");
    c.rope_scaling.original_max_position_embeddings = s.integer("original_max_position_embeddings");
    c.rope_scaling.beta_fast = s.number_or("beta_fast", 32.0);
    c.rope_scaling.beta_slow = s.number_or("beta_slow", 1.0);
    c.rope_scaling.mscale = s.number_or("mscale", 1.0);
    c.rope_scaling.mscale_all_dim = s.number_or("mscale_all_dim", 0.0);
    if (c.rope_scaling.factor < 1.0) r.bad("rope_scaling.factor", "must be >= 1");
  }

  if (r.has("quantization_config")) {
    const json& q = j["quantization_config"];
    Reader s{q, source};
    const std::string method = s.string_or("quant_method", "");
    if (method != "fp8")
      r.bad("quantization_config.quant_method", "is '" + method + "'; only fp8 is supported");
    const std::string fmt_ = s.string_or("fmt", "e4m3");
    if (fmt_ != "e4m3")
      r.bad("quantization_config.fmt", "is '" + fmt_ + "'; only e4m3 is supported");
    if (q.contains("weight_block_size") && q["weight_block_size"] != json::array({128, 128}))
      r.bad("quantization_config.weight_block_size",
            "must be [128, 128], got " + q["weight_block_size"].dump());
    const std::string sf = s.string_or("scale_fmt", "");
    if (!sf.empty() && sf != "ue8m0")
      r.bad("quantization_config.scale_fmt", "is '" + sf + "'; allowed: ue8m0 or absent");
    c.fp8_weights = true;
    c.ue8m0_scales = sf == "ue8m0";
  }

  // Sizes and ids past int32 describe no model (token ids are int32), and sums such as
  // qk_head_dim() must not overflow int64.
  for (auto [f, v] : {std::pair{"vocab_size", c.vocab_size},
                      {"hidden_size", c.hidden_size},
                      {"intermediate_size", c.intermediate_size},
                      {"moe_intermediate_size", c.moe_intermediate_size},
                      {"num_hidden_layers", c.num_hidden_layers},
                      {"num_attention_heads", c.num_attention_heads},
                      {"first_k_dense_replace", c.first_k_dense_replace},
                      {"moe_layer_freq", c.moe_layer_freq},
                      {"n_routed_experts", c.n_routed_experts},
                      {"n_shared_experts", c.n_shared_experts},
                      {"num_experts_per_tok", c.num_experts_per_tok},
                      {"n_group", c.n_group},
                      {"topk_group", c.topk_group},
                      {"q_lora_rank", c.q_lora_rank},
                      {"kv_lora_rank", c.kv_lora_rank},
                      {"qk_nope_head_dim", c.qk_nope_head_dim},
                      {"qk_rope_head_dim", c.qk_rope_head_dim},
                      {"v_head_dim", c.v_head_dim},
                      {"max_position_embeddings", c.max_position_embeddings},
                      {"num_nextn_predict_layers", c.num_nextn_predict_layers},
                      {"bos_token_id", c.bos_token_id},
                      {"eos_token_id", c.eos_token_id},
                      {"rope_scaling.original_max_position_embeddings",
                       c.rope_scaling.original_max_position_embeddings}})
    if (v > INT32_MAX || v < INT32_MIN)
      r.bad(f, fmt::format("is {}: larger than any model's (at most {})", v, INT32_MAX));

  c.hc_mult = r.integer_or("hc_mult", 1);
  if (c.hc_mult != 1 && c.hc_mult != 4)
    r.bad("hc_mult",
          fmt::format("must be 1 (plain residual) or 4 (mHC branches), got {}", c.hc_mult));
  c.hc_sinkhorn_repeat = r.integer_or("hc_sinkhorn_repeat", 10);
  if (c.hc_sinkhorn_repeat < 1 || c.hc_sinkhorn_repeat > 1000)
    r.bad("hc_sinkhorn_repeat", fmt::format("must be in [1, 1000], got {}", c.hc_sinkhorn_repeat));
  c.hc_eps = r.number_or("hc_eps", 1e-6);
  if (!(c.hc_eps > 0 && c.hc_eps < 1))
    r.bad("hc_eps", fmt::format("must be in (0, 1), got {}", c.hc_eps));
  c.hc_post_mult = r.number_or("hc_post_mult", 2.0);
  if (!(c.hc_post_mult > 0 && c.hc_post_mult < 1e6))
    r.bad("hc_post_mult", fmt::format("must be in (0, 1e6), got {}", c.hc_post_mult));
  if (r.has("engram")) c.engram = parse_engram(j["engram"], source, c);
  return c;
}

void check_model_dir(const std::string& dir, const std::string& option) {
  constexpr const char* kHolds =
      "the folder that holds config.json, the *.safetensors and tokenizer.json (e.g. models/tiny)";
  std::error_code ec;
  const auto st = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(st)) DI_FAIL("{} {}: no such folder; give {}", option, dir, kHolds);
  if (!std::filesystem::is_directory(st))
    DI_FAIL("{} {} is a file, not a folder; give {}", option, dir, kHolds);
  if (!std::filesystem::exists(std::filesystem::path(dir) / "config.json", ec))
    DI_FAIL("{} {} has no config.json, so it is not a HuggingFace checkpoint folder; give {}",
            option, dir, kHolds);
}

ModelConfig load_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream f(path);
  if (!f) DI_FAIL("cannot open {}: is --model a HuggingFace checkpoint folder?", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_config(ss.str(), path);
}

}  // namespace deepinfer::model
