#include "synthetic_model.h"

#include <deepinfer/dtype.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "kernels/quant.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {

namespace fs = std::filesystem;

void write_synthetic_tokenizer(const std::string& path, int64_t vocab) {
  using json = nlohmann::json;
  json v = json::object();
  v["<s>"] = 0;
  v["</s>"] = 1;
  for (int b = 0; b < 256; ++b) v[byte_to_unicode_utf8(uint8_t(b))] = 2 + b;
  const std::string space = byte_to_unicode_utf8(uint8_t(' '));
  for (int64_t id = 258; id < vocab; ++id) v[fmt::format("{}w{}", space, id)] = id;
  auto special = [](int id, const char* text) {
    return json{{"id", id},        {"content", text},     {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  json t = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", {special(0, "<s>"), special(1, "</s>")}},
            {"normalizer", nullptr},
            {"pre_tokenizer",
             {{"type", "ByteLevel"},
              {"add_prefix_space", false},
              {"trim_offsets", true},
              {"use_regex", true}}},
            {"post_processor", nullptr},
            {"decoder",
             {{"type", "ByteLevel"},
              {"add_prefix_space", true},
              {"trim_offsets", true},
              {"use_regex", true}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", false},
              {"vocab", v},
              {"merges", json::array()}}}};
  std::ofstream(path) << t.dump();
}

// The synthetic DeepSeek-V3-architecture model of issue 5 (HF layout, no YaRN), stored as the
// official checkpoints are: the linear layers FP8 with 128×128 block scales (weight_scale_inv),
// the embedding, LM head, router and norms BF16.
void write_synthetic_model(const std::string& dir, bool mtp) {
  if (!fs::exists(dir + "/tokenizer.json")) {
    fs::create_directories(dir);
    write_synthetic_tokenizer(dir + "/tokenizer.json", 32000);
  }
  constexpr int64_t kHidden = 2048, kLayers = 8, kDense = 1, kInter = 5632, kExperts = 32,
                    kTopk = 4, kGroups = 4, kTopkGroup = 2, kShared = 1, kMoeInter = 512,
                    kHeads = 16, kQLora = 768, kKvLora = 256, kNope = 64, kRope = 64, kV = 64,
                    kVocab = 32000;
  if (fs::exists(dir + "/model.safetensors") && fs::exists(dir + "/config.json")) return;
  fs::create_directories(dir);
  std::fprintf(stderr, "writing the synthetic model to %s ...\n", dir.c_str());
  std::mt19937_64 rng(20250101);
  std::vector<std::vector<uint16_t>> store;
  std::vector<std::vector<float>> fstore;
  std::vector<std::vector<fp8_e4m3>> qstore;
  std::vector<model::TensorToWrite> ts;
  auto bf16_tensor = [&](const std::string& name, std::vector<int64_t> shape, float amp) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    std::vector<uint16_t> v(static_cast<size_t>(n));
    // xorshift for speed; values uniform in [-amp, amp].
    uint64_t x = rng();
    for (auto& e : v) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      const float u = float(int32_t(x >> 32)) * (1.0f / 2147483648.0f);
      e = f32_to_bf16(u * amp).bits;
    }
    store.push_back(std::move(v));
    ts.push_back({name, DType::bf16, shape, store.back().data()});
  };
  auto ones = [&](const std::string& name, int64_t n) {
    store.emplace_back(size_t(n), f32_to_bf16(1.0f).bits);
    ts.push_back({name, DType::bf16, {n}, store.back().data()});
  };
  auto bf16_lin = [&](const std::string& name, int64_t out, int64_t in) {
    bf16_tensor(name + ".weight", {out, in}, std::sqrt(3.0f / float(in)));
  };
  // Random BF16 values cast as the engine's --quantize fp8 casts them (the same weights either
  // way).
  auto lin = [&](const std::string& name, int64_t out, int64_t in) {
    bf16_lin(name, out, in);
    const std::vector<uint16_t> src = std::move(store.back());
    store.pop_back();
    ts.pop_back();
    std::vector<float> w(src.size());
    for (size_t i = 0; i < src.size(); ++i) w[i] = bf16_to_f32(bf16{src[i]});
    qstore.emplace_back(src.size());
    fstore.emplace_back(size_t(kernels::num_blocks(out) * kernels::num_blocks(in)));
    kernels::QuantBlockParams p;
    p.w = w.data();
    p.q = qstore.back().data();
    p.scales = fstore.back().data();
    p.n = out;
    p.k = in;
    kernels::quant_per_block(p);
    ts.push_back({name + ".weight", DType::e4m3, {out, in}, qstore.back().data()});
    ts.push_back({name + ".weight_scale_inv",
                  DType::f32,
                  {kernels::num_blocks(out), kernels::num_blocks(in)},
                  fstore.back().data()});
  };
  store.reserve(1024);
  fstore.reserve(1024);
  qstore.reserve(1024);
  bf16_tensor("model.embed_tokens.weight", {kVocab, kHidden}, 1.0f);
  bf16_tensor("lm_head.weight", {kVocab, kHidden}, std::sqrt(3.0f / kHidden));
  ones("model.norm.weight", kHidden);
  for (int64_t l = 0; l < kLayers + (mtp ? 1 : 0); ++l) {
    const std::string p = fmt::format("model.layers.{}", l);
    if (l == kLayers) {  // the MTP module's own tensors; its block follows as a layer
      ones(p + ".enorm.weight", kHidden);
      ones(p + ".hnorm.weight", kHidden);
      lin(p + ".eh_proj", kHidden, 2 * kHidden);
      ones(p + ".shared_head.norm.weight", kHidden);
    }
    ones(p + ".input_layernorm.weight", kHidden);
    ones(p + ".post_attention_layernorm.weight", kHidden);
    lin(p + ".self_attn.q_a_proj", kQLora, kHidden);
    ones(p + ".self_attn.q_a_layernorm.weight", kQLora);
    lin(p + ".self_attn.q_b_proj", kHeads * (kNope + kRope), kQLora);
    lin(p + ".self_attn.kv_a_proj_with_mqa", kKvLora + kRope, kHidden);
    ones(p + ".self_attn.kv_a_layernorm.weight", kKvLora);
    lin(p + ".self_attn.kv_b_proj", kHeads * (kNope + kV), kKvLora);
    lin(p + ".self_attn.o_proj", kHidden, kHeads * kV);
    const std::string m = p + ".mlp";
    if (l < kDense) {
      lin(m + ".gate_proj", kInter, kHidden);
      lin(m + ".up_proj", kInter, kHidden);
      lin(m + ".down_proj", kHidden, kInter);
      continue;
    }
    bf16_lin(m + ".gate", kExperts, kHidden);  // the router stays BF16
    fstore.emplace_back(size_t(kExperts));
    for (auto& b : fstore.back()) b = float(int64_t(rng() % 2001) - 1000) * 1e-5f;
    ts.push_back(
        {m + ".gate.e_score_correction_bias", DType::f32, {kExperts}, fstore.back().data()});
    for (int64_t e = 0; e < kExperts; ++e) {
      const std::string x = fmt::format("{}.experts.{}", m, e);
      lin(x + ".gate_proj", kMoeInter, kHidden);
      lin(x + ".up_proj", kMoeInter, kHidden);
      lin(x + ".down_proj", kHidden, kMoeInter);
    }
    lin(m + ".shared_experts.gate_proj", kShared * kMoeInter, kHidden);
    lin(m + ".shared_experts.up_proj", kShared * kMoeInter, kHidden);
    lin(m + ".shared_experts.down_proj", kHidden, kShared * kMoeInter);
  }
  model::write_safetensors(dir + "/model.safetensors.tmp", ts, {{"format", "pt"}});
  fs::rename(dir + "/model.safetensors.tmp", dir + "/model.safetensors");
  std::ofstream cfg(dir + "/config.json");
  cfg << fmt::format(R"({{
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": {}, "hidden_size": {}, "intermediate_size": {}, "moe_intermediate_size": {},
  "num_hidden_layers": {}, "num_attention_heads": {}, "num_key_value_heads": {},
  "first_k_dense_replace": {}, "moe_layer_freq": 1, "n_routed_experts": {}, "n_shared_experts": {},
  "num_experts_per_tok": {}, "n_group": {}, "topk_group": {}, "topk_method": "noaux_tc",
  "scoring_func": "sigmoid", "norm_topk_prob": true, "routed_scaling_factor": 2.5,
  "q_lora_rank": {}, "kv_lora_rank": {}, "qk_nope_head_dim": {}, "qk_rope_head_dim": {}, "v_head_dim": {},
  "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "rope_scaling": null,
  "max_position_embeddings": 4096, "num_nextn_predict_layers": {}, "attention_bias": false,
  "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "quantization_config": {{"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]}}
}}
)",
                     kVocab, kHidden, kInter, kMoeInter, kLayers, kHeads, kHeads, kDense, kExperts,
                     kShared, kTopk, kGroups, kTopkGroup, kQLora, kKvLora, kNope, kRope, kV,
                     mtp ? 1 : 0);
}

}  // namespace deepinfer::cli
