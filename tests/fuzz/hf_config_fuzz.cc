// libFuzzer entry point for a Hugging Face config.json (ptc::hf::ModelOfConfig):
// it must never crash, and a model it accepts must map (MapModel) and be
// written back (PlanExport's config.json) as a config that reads as the same
// model: its schema and dims (Llama, Mixtral, Qwen3-MoE's experts and dense
// layers, Qwen2-MoE's shared expert and its gate, DeepSeek-V3's MLA dims and router bias,
// GPTBigCode).
// Run: ./hf_config_fuzz -max_total_time=60 -max_len=4096 tests/fuzz/corpus/hf_config_fuzz
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ptc/checkpoint/hf/hf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const nlohmann::json doc = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  auto model = ptc::hf::ModelOfConfig(doc, "fuzz");
  if (!model.ok()) return 0;
  const ptc::ModelDims& d = model->dims;
  // Small models only: a config may ask for millions of layers or experts.
  if (d.layers > 64 || d.experts > 64 || d.hidden > 4096 || d.vocab > 4096) return 0;
  ptc::ModelSpec spec;
  spec.schema = model->schema;
  spec.dims = d;
  auto plan = ptc::hf::PlanExport(spec, ptc::hf::kDefaultShardBytes, doc);
  if (!plan.ok()) return 0;  // dims the architecture cannot hold (named), never a crash
  if (plan->model.arch != model->arch) __builtin_trap();
  auto again = ptc::hf::ModelOfConfig(nlohmann::json::parse(plan->config_json), "again");
  if (!again.ok() || !(again->dims == d) || again->schema.ToJson() != model->schema.ToJson()) __builtin_trap();
  return 0;
}
