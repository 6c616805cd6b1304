// torchtitan's names of a Llama, Qwen3 MoE or DeepSeek-V3 model in a DCP checkpoint (dcp.h, TorchtitanTensors).
#include <algorithm>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/hf/hf.h"

namespace ptc::dcp {
namespace {

// HF's Llama names (hf.h) -> torchtitan's (a layer's without "model.layers.I." / "layers.I.").
struct Rename {
  bool layer;
  std::string_view hf, titan;
  bool rope = false;  // rows in torchtitan's RoPE order
};
constexpr Rename kRenames[] = {
    {false, "model.embed_tokens.weight", "tok_embeddings.weight"},
    {false, "model.norm.weight", "norm.weight"},
    {false, "lm_head.weight", "lm_head.weight"},
    {true, "self_attn.q_proj.weight", "attention.qkv_linear.wq.weight", true},
    {true, "self_attn.k_proj.weight", "attention.qkv_linear.wk.weight", true},
    {true, "self_attn.v_proj.weight", "attention.qkv_linear.wv.weight"},
    {true, "self_attn.o_proj.weight", "attention.wo.weight"},
    {true, "mlp.gate_proj.weight", "feed_forward.w1.weight"},
    {true, "mlp.up_proj.weight", "feed_forward.w3.weight"},
    {true, "mlp.down_proj.weight", "feed_forward.w2.weight"},
    {true, "input_layernorm.weight", "attention_norm.weight"},
    {true, "post_attention_layernorm.weight", "ffn_norm.weight"},
};

// torchtitan's Qwen3 (Qwen3StateDictAdapter's names), for a mixture of
// experts: its RoPE is HF's rotate-half (CosSinRoPE), so no row is moved; the
// experts of a layer are one [experts, ...] tensor each (GroupedExperts).
constexpr Rename kMoeRenames[] = {
    {false, "model.embed_tokens.weight", "tok_embeddings.weight"},
    {false, "model.norm.weight", "norm.weight"},
    {false, "lm_head.weight", "lm_head.weight"},
    {true, "self_attn.q_proj.weight", "attention.qkv_linear.wq.weight"},
    {true, "self_attn.k_proj.weight", "attention.qkv_linear.wk.weight"},
    {true, "self_attn.v_proj.weight", "attention.qkv_linear.wv.weight"},
    {true, "self_attn.o_proj.weight", "attention.wo.weight"},
    {true, "self_attn.q_norm.weight", "attention.q_norm.weight"},
    {true, "self_attn.k_norm.weight", "attention.k_norm.weight"},
    {true, "mlp.gate_proj.weight", "feed_forward.w1.weight"},
    {true, "mlp.up_proj.weight", "feed_forward.w3.weight"},
    {true, "mlp.down_proj.weight", "feed_forward.w2.weight"},
    {true, "input_layernorm.weight", "attention_norm.weight"},
    {true, "post_attention_layernorm.weight", "ffn_norm.weight"},
    {true, "mlp.gate.weight", "moe.router.gate.weight"},
    {true, "block_sparse_moe.gate.weight", "moe.router.gate.weight"},
    // The shared experts (hf::MapOptions' names): MoE.shared_experts, a FeedForward.
    {true, "mlp.shared_experts.gate_proj.weight", "moe.shared_experts.w1.weight"},
    {true, "mlp.shared_experts.up_proj.weight", "moe.shared_experts.w3.weight"},
    {true, "mlp.shared_experts.down_proj.weight", "moe.shared_experts.w2.weight"},
};

// torchtitan's DeepSeek-V3 (DeepSeekV3StateDictAdapter's names): multi-head
// latent attention, rows as HF's (both keep DeepSeek's rope pairs), and the
// MoE of kMoeRenames with the router's bias as the MoE's expert_bias_E.
constexpr Rename kMlaRenames[] = {
    {false, "model.embed_tokens.weight", "tok_embeddings.weight"},
    {false, "model.norm.weight", "norm.weight"},
    {false, "lm_head.weight", "lm_head.weight"},
    {true, "self_attn.q_proj.weight", "attention.wq.weight"},
    {true, "self_attn.q_a_proj.weight", "attention.wq_a.weight"},
    {true, "self_attn.q_a_layernorm.weight", "attention.q_norm.weight"},
    {true, "self_attn.q_b_proj.weight", "attention.wq_b.weight"},
    {true, "self_attn.kv_a_proj_with_mqa.weight", "attention.wkv_a.weight"},
    {true, "self_attn.kv_a_layernorm.weight", "attention.kv_norm.weight"},
    {true, "self_attn.kv_b_proj.weight", "attention.wkv_b.weight"},
    {true, "self_attn.o_proj.weight", "attention.wo.weight"},
    {true, "mlp.gate_proj.weight", "feed_forward.w1.weight"},
    {true, "mlp.up_proj.weight", "feed_forward.w3.weight"},
    {true, "mlp.down_proj.weight", "feed_forward.w2.weight"},
    {true, "input_layernorm.weight", "attention_norm.weight"},
    {true, "post_attention_layernorm.weight", "ffn_norm.weight"},
    {true, "mlp.gate.weight", "moe.router.gate.weight"},
    {true, "mlp.gate.e_score_correction_bias", "moe.expert_bias_E"},
    {true, "mlp.shared_experts.gate_proj.weight", "moe.shared_experts.w1.weight"},
    {true, "mlp.shared_experts.up_proj.weight", "moe.shared_experts.w3.weight"},
    {true, "mlp.shared_experts.down_proj.weight", "moe.shared_experts.w2.weight"},
};

// An expert's HF tensor (its name after "experts.E.") -> torchtitan's stacked key.
struct ExpertRename {
  std::string_view hf, titan;
};
constexpr ExpertRename kExpertRenames[] = {
    {"gate_proj.weight", "moe.routed_experts.inner_experts.w1_EFD"},
    {"up_proj.weight", "moe.routed_experts.inner_experts.w3_EFD"},
    {"down_proj.weight", "moe.routed_experts.inner_experts.w2_EDF"},
    {"w1.weight", "moe.routed_experts.inner_experts.w1_EFD"},  // Mixtral's
    {"w3.weight", "moe.routed_experts.inner_experts.w3_EFD"},
    {"w2.weight", "moe.routed_experts.inner_experts.w2_EDF"},
};

// The digits of `s` at `at` and the dot after them: their value, `at` moved past the dot.
std::optional<Index> Number(const std::string& s, size_t* at) {
  size_t i = *at;
  Index n = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9' && n < (Index{1} << 40)) n = n * 10 + (s[i++] - '0');
  if (i == *at || i >= s.size() || s[i] != '.') return std::nullopt;
  *at = i + 1;
  return n;
}

// torchtitan's name of HF tensor `hf` by `renames`; `expert` set (else -1) for
// an expert's (`moe`), whose key is its layer's stacked tensor.
const Rename* Find(const std::string& hf, std::span<const Rename> renames, bool moe, std::string* titan,
                   Index* expert) {
  constexpr std::string_view kLayers = "model.layers.";
  *expert = -1;
  size_t at = kLayers.size();
  const std::optional<Index> layer = hf.rfind(kLayers, 0) == 0 ? Number(hf, &at) : std::nullopt;
  const std::string prefix = layer ? "layers." + std::to_string(*layer) + "." : "";
  const std::string_view rest = layer ? std::string_view(hf).substr(at) : std::string_view(hf);
  for (const Rename& r : renames) {
    if (r.layer == layer.has_value() && r.hf == rest) {
      *titan = prefix + std::string(r.titan);
      return &r;
    }
  }
  static constexpr Rename kExpert = {true, "", ""};
  for (std::string_view experts : {"mlp.experts.", "block_sparse_moe.experts."}) {
    if (!moe || !layer || rest.substr(0, experts.size()) != experts) continue;
    size_t e = at + experts.size();
    const std::optional<Index> id = Number(hf, &e);
    for (const ExpertRename& r : kExpertRenames) {
      if (id && std::string_view(hf).substr(e) == r.hf) {
        *titan = prefix + std::string(r.titan);
        *expert = *id;
        return &kExpert;
      }
    }
  }
  return nullptr;
}

}  // namespace

Result<std::vector<Tensor>> TorchtitanTensors(const ModelSpec& spec) {
  PTC_ASSIGN_OR_RETURN(const hf::Model model,
                       hf::MapModel(spec, {.ungated_shared_experts = true, .expert_bias_optional = true}),
                       "torchtitan names");
  if (model.arch == hf::Arch::kGptBigCode) {
    return InvalidArgumentError("schema " + spec.schema.name +
                                ": torchtitan's names are Llama's or Qwen3's (the built-in llama schema); "
                                "docs/dcp_format.md");
  }
  if (model.arch == hf::Arch::kQwen2Moe) {
    return InvalidArgumentError("schema " + spec.schema.name +
                                ": rule 'decoder.layers.{i}.mlp.shared_experts.gate_weight' (the shared experts' "
                                "sigmoid gate) has no torchtitan name: torchtitan 0.3's MoE.shared_experts is an "
                                "ungated FeedForward; docs/dcp_format.md");
  }
  const bool moe = model.arch != hf::Arch::kLlama;
  const std::span<const Rename> renames = model.arch == hf::Arch::kDeepseekV3 ? std::span<const Rename>(kMlaRenames)
                                          : moe ? std::span<const Rename>(kMoeRenames)
                                                : std::span<const Rename>(kRenames);
  const Index head_dim = spec.dims.head_dim;
  if (head_dim % 2 != 0) {
    return InvalidArgumentError("dims " + spec.dims.ToString() + ": torchtitan's RoPE needs an even head_dim");
  }
  std::vector<Tensor> params;
  std::set<std::string> buffers;  // global tensors without optimizer state (its expert_bias_E in a marked schema)
  for (const LocalTensor& hf : model.tensors) {
    if (!HasOptimizerState(hf)) buffers.insert(hf.segments.front().tensor);
    std::string name;
    Index expert = -1;
    const Rename* r = Find(hf.name, renames, moe, &name, &expert);
    if (r == nullptr) return InternalError("no torchtitan name for " + hf.name);
    // The HF tensor's segments are row blocks of one global tensor, dense in order.
    Tensor t{hf.segments.front().tensor, name, {name}, hf.dtype, hf.shape};
    if (expert >= 0) {  // one [experts, ...] key per layer: this expert's slice
      t.layer = expert;
      t.layers = spec.dims.experts;
    }
    const Index inner = NumElements(hf.shape) / hf.shape[0];
    for (const Segment& s : hf.segments) {
      if (s.tensor != t.name || s.layout.offset % inner != 0)
        return InternalError("HF tensor " + hf.name + " is no row cut");
      const Index dst = s.layout.offset / inner, rows = s.box.end[0] - s.box.begin[0];
      if (!r->rope) {
        t.blocks.push_back(RowBlock{dst, rows, {s.box.begin[0]}});
        continue;
      }
      if (rows % head_dim != 0) return InternalError("HF tensor " + hf.name + " cuts a head");
      for (Index h = 0; h < rows; h += head_dim) {  // a head: its halves woven
        const Index src = s.box.begin[0] + h;
        t.blocks.push_back(RowBlock{dst + h, head_dim, {src, src + head_dim / 2}});
      }
    }
    params.push_back(std::move(t));
  }
  std::vector<Tensor> out = params;
  if (!spec.optimizer) return out;
  // The optimizer's parameters are the model's but for wq, wk and wv: one fused
  // wqkv, linear_qkv's rows in its group-major order with q and k heads woven.
  std::vector<Tensor> optimized;
  const Index groups = spec.dims.kv_heads, per_group = spec.dims.heads / spec.dims.kv_heads;
  for (const Tensor& p : params) {
    if (buffers.count(p.name) != 0) continue;
    if (moe) {  // Qwen3's wqkv: linear_qkv's rows as they are (no RoPE weave)
      if (p.key.find(".qkv_linear.wk.") != std::string::npos || p.key.find(".qkv_linear.wv.") != std::string::npos) {
        continue;
      }
      const size_t at = p.key.find(".qkv_linear.wq.");
      if (at == std::string::npos) {
        optimized.push_back(p);
        continue;
      }
      const Index rows = (per_group + 2) * groups * head_dim;
      optimized.push_back(Tensor{p.name,
                                 p.key.substr(0, at) + ".qkv_linear.wqkv.weight",
                                 {},
                                 p.dtype,
                                 Shape{rows, p.shape[1]},
                                 -1,
                                 0,
                                 {RowBlock{0, rows, {0}}}});
      continue;
    }
    const size_t at = p.key.find(".qkv_linear.wq.");
    if (at == std::string::npos) {
      if (p.key.find(".qkv_linear.wk.") == std::string::npos && p.key.find(".qkv_linear.wv.") == std::string::npos) {
        optimized.push_back(p);
      }
      continue;
    }
    Tensor fused{p.name,
                 p.key.substr(0, at) + ".qkv_linear.wqkv.weight",
                 {},
                 p.dtype,
                 Shape{(per_group + 2) * groups * head_dim, p.shape[1]}};
    for (Index g = 0; g < groups; ++g) {
      const Index base = g * (per_group + 2) * head_dim;
      for (Index h = 0; h <= per_group; ++h) {  // the group's q heads, then its k head
        const Index src = base + h * head_dim;
        fused.blocks.push_back(RowBlock{src, head_dim, {src, src + head_dim / 2}});
      }
      const Index v = base + (per_group + 1) * head_dim;
      fused.blocks.push_back(RowBlock{v, head_dim, {v}});
    }
    optimized.push_back(std::move(fused));
  }
  {
    for (const Tensor& p : optimized) {
      for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
        Tensor s = p;
        s.name = p.name + "." + kind;
        s.dtype = DType::kF32;
        const std::string state = "state." + p.key + "." + kind;
        s.key = "optimizer." + state;
        s.path = {"optimizer", state};
        out.push_back(std::move(s));
      }
    }
  }
  return out;
}

std::vector<Segment> ChunkSegments(const Tensor& t, const Box& box) {
  if (t.blocks.empty()) return {Segment{t.name, box, DenseLayout(box)}};
  const Layout dense = DenseLayout(box);
  std::vector<Segment> out;
  for (const RowBlock& b : t.blocks) {
    const Index n = static_cast<Index>(b.src.size());
    const Index first = std::max(box.begin[0], b.dst), last = std::min(box.end[0], b.dst + b.rows);
    if (first >= last) continue;
    for (Index j = 0; j < n; ++j) {
      // Rows dst + k*n + j in [first, last).
      const auto ceil_div = [](Index a, Index d) { return a <= 0 ? 0 : (a + d - 1) / d; };
      const Index k0 = ceil_div(first - b.dst - j, n), k1 = ceil_div(last - b.dst - j, n);
      if (k0 >= k1) continue;
      Box src = box;
      src.begin[0] = b.src[static_cast<size_t>(j)] + k0;
      src.end[0] = b.src[static_cast<size_t>(j)] + k1;
      Layout layout = dense;
      layout.offset = (b.dst + k0 * n + j - box.begin[0]) * dense.strides[0];
      layout.strides[0] *= n;
      out.push_back(Segment{t.name, std::move(src), std::move(layout)});
    }
  }
  return out;
}

}  // namespace ptc::dcp
