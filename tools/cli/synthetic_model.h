// The synthetic DeepSeek-V3-architecture model the benchmarks run (hidden 2048, 8 layers, 32
// experts top-4, vocabulary 32000, random weights, FP8 linears as the official checkpoints;
// docs/performance.md), written once into a
// folder in the HuggingFace layout with a tokenizer.json that covers its vocabulary.
#pragma once

#include <cstdint>
#include <string>

namespace deepinfer::cli {

// Writes config.json, model.safetensors and tokenizer.json into `dir` unless they are there.
// mtp: with one MTP module (layer 8: enorm, hnorm, eh_proj, an MoE block, shared_head.norm).
void write_synthetic_model(const std::string& dir, bool mtp = false);

// A byte-level BPE tokenizer.json with `vocab` ids: 0 and 1 are BOS and EOS, then the 256 byte
// tokens, then filler words " w<id>" (no merges reach them; they decode to readable text).
void write_synthetic_tokenizer(const std::string& path, int64_t vocab);

}  // namespace deepinfer::cli
