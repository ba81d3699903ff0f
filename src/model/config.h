// config.json of a HuggingFace DeepSeek-V3 / V2 / V2-Lite checkpoint: every field the
// architecture uses, validated at load (an unknown or inconsistent value names the field).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer::model {

enum class TopkMethod : uint8_t { noaux_tc, greedy, group_limited_greedy };
enum class ScoringFunc : uint8_t { sigmoid, softmax };

struct YarnScaling {
  bool enabled = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

// The `engram` object of config.json (docs/engram.md §1): hashed n-gram memory in the listed
// blocks.
struct EngramModelConfig {
  std::vector<int64_t> layer_ids;          // 0-based blocks, strictly increasing; empty = no Engram
  int64_t max_ngram_size = 0;              // orders 2..max_ngram_size are looked up
  int64_t n_head_per_ngram = 0;            // hash heads per order
  int64_t n_embed_per_ngram = 0;           // width of one order's heads together
  std::vector<int64_t> engram_vocab_size;  // table budget per order (max_ngram_size - 1 entries)
  int64_t kernel_size = 0;                 // short conv taps; dilation = max_ngram_size
  int64_t pad_id = 0;                      // raw id before the sequence start
  int64_t seed = 0;

  bool enabled() const { return !layer_ids.empty(); }
  int64_t num_layers() const { return int64_t(layer_ids.size()); }
  int64_t heads() const { return (max_ngram_size - 1) * n_head_per_ngram; }  // per layer
  int64_t head_dim() const { return n_embed_per_ngram / n_head_per_ngram; }  // D, one table row
  int64_t embed_dim() const { return (max_ngram_size - 1) * n_embed_per_ngram; }  // E = heads·D
  int64_t dilation() const { return max_ngram_size; }
  // Positions before the current one the short conv reads: (K - 1)·dilation.
  int64_t conv_history() const { return (kernel_size - 1) * dilation(); }
  // The index of `layer` in layer_ids, or -1.
  int64_t index_of(int64_t layer) const;
};

struct ModelConfig {
  std::string model_type;  // deepseek_v3 | deepseek_v2
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense SwiGLU width
  int64_t moe_intermediate_size = 0;  // one expert's width
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t n_routed_experts = 0;  // 0 = no MoE layers
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  TopkMethod topk_method = TopkMethod::noaux_tc;
  ScoringFunc scoring_func = ScoringFunc::sigmoid;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int64_t q_lora_rank = 0;  // 0 = direct q_proj (V2-Lite)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  YarnScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  int64_t num_nextn_predict_layers = 0;  // MTP modules (layers num_hidden_layers + i)
  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  bool fp8_weights = false;   // quantization_config fp8 e4m3 with [128, 128] blocks
  bool ue8m0_scales = false;  // quantization_config.scale_fmt == "ue8m0"
  // mHC (docs/engram.md §2): the residual stream as hc_mult branches (1 = the plain residual).
  int64_t hc_mult = 1;
  int64_t hc_sinkhorn_repeat = 10;
  double hc_eps = 1e-6;  // mHC's RMS, pre, Sinkhorn and head eps
  double hc_post_mult = 2.0;
  EngramModelConfig engram;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool is_moe_layer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  // YaRN attention factor: 0.1·m·ln(factor) + 1 (1 without scaling).
  static double yarn_mscale(double factor, double m);
  // qk_head_dim^-0.5 · mscale(factor, mscale_all_dim)^2 (never 576^-0.5; docs/numerics.md §5).
  double softmax_scale() const;
  std::string summary() const;
};

// Parses and validates `dir/config.json`. Throws Error naming the file and the field.
ModelConfig load_config(const std::string& dir);

// Throws Error saying what is wrong and what to give instead when `dir` is not a checkpoint folder
// (missing, a file, or without config.json). `option` names where the user gave it.
void check_model_dir(const std::string& dir, const std::string& option = "--model");
ModelConfig parse_config(const std::string& json_text, const std::string& source);

}  // namespace deepinfer::model
