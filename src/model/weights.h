// The weights one rank needs, loaded from a Checkpoint: attention, dense FFNs, norms,
// embeddings and the router are replicated (data-parallel attention); routed experts are
// sharded by EP rank (a rank loads only its own). FP8 weights point into the mmap; BF16
// checkpoints are used as they are or quantized to FP8 128×128 blocks at load (--quantize fp8).
#pragma once

#include <deepinfer/dtype.h>
#include <deepinfer/tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/engram.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "tokenizer/compression.h"

namespace deepinfer::model {

// How linear layers compute (docs/numerics.md §3): fp8 = block-scaled FP8 GEMM with 1×128
// activation quantization; bf16 = weights dequantized to BF16 once at load, BF16 GEMM with fp32
// accumulation.
enum class GemmMode : uint8_t { fp8, bf16 };

// y = x·Wᵀ with W [out, in]. Exactly one of (w_fp8 + w_scale) or w_bf16 is set.
struct Linear {
  std::string name;
  int64_t out = 0, in = 0;
  const fp8_e4m3* w_fp8 = nullptr;  // [out, in]
  const float* w_scale = nullptr;   // [ceil(out/128), ceil(in/128)] multipliers: W = q·S
  const bf16* w_bf16 = nullptr;     // [out, in]
  const uint8_t* w_decode =
      nullptr;  // w_fp8 in the cpu decode layout (kernels::pack_decode_layout), or null
  Tensor owned_w, owned_scale;  // storage when converted at load
  Tensor owned_decode;          // storage of w_decode
  // With several ranks, the BF16 LM head's columns this rank computes ([slice.first, slice.second),
  // rank_columns), copied to weight storage at w_slice (storage: owned_w); w_bf16 stays in the
  // mapping. Null elsewhere.
  const bf16* w_slice = nullptr;
  std::pair<int64_t, int64_t> slice{0, 0};
  bool fp8() const { return w_fp8 != nullptr; }
  size_t weight_bytes() const;  // bytes read per use (weights + scales)
};

struct Mlp {  // SwiGLU: down(silu(gate·x) ⊙ up·x)
  Linear gate, up, down;
};

// One mHC mixing (docs/engram.md §2): fn [m, hc·hidden], scale [3] (head: [1]), base [m] f32,
// m = hc(hc + 2) before a sub-layer, hc for the head. Null when hc_mult = 1.
struct MhcWeights {
  const float* fn = nullptr;
  const float* scale = nullptr;
  const float* base = nullptr;
};

// One Engram block's dense weights (docs/engram.md §1); its table rows live in the EngramBuffer.
struct EngramLayerWeights {
  int64_t layer = -1;                // the block
  Linear value;                      // value_proj [hidden, E] BF16
  const bf16* value_bias = nullptr;  // [hidden]
  Tensor keys;                       // key_projs.0..hc-1 stacked: [hc·hidden, E] bf16
  Tensor key_bias;                   // [hc·hidden] bf16
  Tensor w_fused;                    // [hc, hidden] f32: norm1.i ⊙ norm2.i (the gate's weight)
  Tensor conv_norm;                  // [hc, hidden] bf16: short_conv.norms.i
  const bf16* conv_w = nullptr;      // short_conv.conv.weight [hc·hidden, 1, K] bf16
  const bf16* table = nullptr;       // embedding.weight [rows, D] bf16 (mmap; read by row ranges)
};

// Everything the Engram blocks need besides the dense weights.
struct EngramWeights {
  std::shared_ptr<const CompressionTable> compression;  // raw -> canonical token ids
  int32_t pad_canonical = 0;                            // compress(pad_id)
  // Multipliers and prime table sizes (the checkpoint's where it has them, else derived from the
  // seed); offsets hold each layer's base row in the one table of all layers (row_base).
  kernels::EngramHashTables hash;
  std::vector<int64_t> row_base;  // [L] first row of each layer's table in the one table
  int64_t total_rows = 0;         // rows of all layers' tables
  std::vector<EngramLayerWeights> layers;
};

struct LayerWeights {
  const bf16* input_norm = nullptr;      // [hidden]
  const bf16* post_attn_norm = nullptr;  // [hidden]
  // MLA
  Linear q_a, q_b, q;               // q_a/q_b with q LoRA, q (direct) without
  const bf16* q_a_norm = nullptr;   // [q_lora_rank]
  Linear kv_a;                      // [kv_lora + rope, hidden]
  const bf16* kv_a_norm = nullptr;  // [kv_lora_rank]
  Linear kv_b;                      // [heads·(nope + v), kv_lora], head-major [k_nope | v]
  Linear o;                         // [hidden, heads·v]
  // FFN
  bool moe = false;
  Mlp dense;                           // dense layers
  Linear router;                       // [n_routed, hidden] BF16; logits f32 (gemm_bf16 out_f32)
  const float* router_bias = nullptr;  // [n_routed] f32 (noaux_tc), else null
  std::vector<Mlp> experts;            // this rank's experts, local id = e - first_local_expert
  Mlp shared;                          // n_shared_experts fused (width n_shared·moe_inter)
  bool has_shared = false;
  // mHC (hc_mult > 1): the mixings before attention and before the FFN.
  MhcWeights attn_hc, ffn_hc;
  int64_t engram = -1;  // index into ModelWeights::engram.layers, or -1
};

// One multi-token-prediction module (docs/architecture.md §6.1): its block is
// ModelWeights::layers[num_hidden_layers + i]; the embedding is the main model's.
struct MtpWeights {
  const bf16* enorm = nullptr;      // [hidden], on the next token's embedding
  const bf16* hnorm = nullptr;      // [hidden], on the main model's hidden state
  Linear eh_proj;                   // [hidden, 2·hidden] over [enorm(e) | hnorm(h)]
  const bf16* head_norm = nullptr;  // shared_head.norm [hidden]
  Linear head;                      // shared_head.head [vocab, hidden] BF16, or the main lm_head
};

struct LoadOptions {
  int ep_rank = 0;
  int ep_size = 1;
  GemmMode gemm = GemmMode::fp8;
  bool quantize_fp8 = false;  // BF16 linears -> FP8 128×128 blocks at load
  bool progress = false;      // progress bar on stderr
  bool decode_layout =
      false;         // fp8 linears also get the cpu decode layout (DEEPINFER_DECODE_LAYOUT)
  bool mtp = false;  // also load the first MTP module (speculative decoding); an Error without one
  bool fp8_head = false;  // the LM head(s) as FP8 128×128 blocks too (opt-in: checkpoints ship
                          // them BF16; accuracy in docs/performance.md §8)
  // Engram: the compression table of the model's tokenizer (built once per process by the
  // launcher); null = built from the checkpoint folder's tokenizer.json here.
  std::shared_ptr<const CompressionTable> compression;
};

struct ModelWeights {
  ModelConfig config;
  std::shared_ptr<const Checkpoint> checkpoint;  // keeps the mmap alive
  const bf16* embed = nullptr;                   // [vocab, hidden]
  const bf16* final_norm = nullptr;              // [hidden]
  Linear lm_head;                                // [vocab, hidden], BF16 GEMM with fp32 logits
  std::vector<LayerWeights> layers;              // the main layers, then the MTP modules' blocks
  std::vector<MtpWeights> mtp;  // loaded MTP modules (LoadOptions::mtp: the first one)
  MhcWeights hc_head;           // hc_mult > 1: the branches' mix before the final norm
  EngramWeights engram;         // config.engram enabled
  int64_t first_local_expert = 0;
  int64_t num_local_experts = 0;
  size_t loaded_bytes = 0;
};

// Loads and checks every tensor this rank needs; an absent tensor, a wrong shape or dtype, or a
// config the engine cannot run is an Error naming the tensor or field.
std::shared_ptr<ModelWeights> load_weights(std::shared_ptr<const Checkpoint> checkpoint,
                                           const ModelConfig& config, const LoadOptions& opts);

// The compression table of the tokenizer.json in `dir` (docs/engram.md §1.2).
std::shared_ptr<const CompressionTable> load_compression_table(const std::string& dir);

// Converts a BF16 [out, in] weight to FP8 with 128×128 block scales (scale = amax/448, partial
// edge blocks), as the official checkpoints' quantizer does.
void quantize_linear_fp8(Linear& l);

// Rank q's share of n output columns when W ranks split them: whole 128-column blocks (the LM
// head's vocabulary, a dense MLP's intermediate channels).
std::pair<int64_t, int64_t> rank_columns(int64_t n, int64_t q, int64_t W);

}  // namespace deepinfer::model
