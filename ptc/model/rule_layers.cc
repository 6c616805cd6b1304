#include "ptc/model/rule_layers.h"

#include "ptc/model/expr.h"

namespace ptc {

Result<bool> RuleWhen(const TensorRule& rule, const ModelDims& dims) {
  if (rule.when.empty()) return true;
  PTC_ASSIGN_OR_RETURN(Index v, EvalExpr(rule.when, [&dims](std::string_view name) { return dims.Lookup(name); }),
                       "rule '" + rule.name + "': when");
  return v != 0;
}

bool RuleOnLayer(const TensorRule& rule, const ModelDims& dims, Index layer) {
  switch (rule.layers) {
    case LayerKind::kAll:
      return true;
    case LayerKind::kDense:
      return !dims.IsMoeLayer(layer);
    case LayerKind::kMoe:
      return dims.IsMoeLayer(layer);
  }
  return false;
}

Result<uint64_t> RuleTensors(const TensorRule& rule, const ModelDims& dims) {
  PTC_ASSIGN_OR_RETURN(bool when, RuleWhen(rule, dims));
  if (!when) return uint64_t{0};
  if (rule.pp != PpPlacement::kLayer) return uint64_t{1};
  const Index moe = dims.MoeLayers();
  const uint64_t layers = static_cast<uint64_t>(rule.layers == LayerKind::kAll     ? dims.layers
                                                : rule.layers == LayerKind::kDense ? dims.layers - moe
                                                                                   : moe);
  return layers * static_cast<uint64_t>(rule.expert ? dims.experts : 1);
}

std::pair<Index, Index> RankExperts(const ModelDims& dims, const ParallelConfig& config, int ep_rank) {
  const Index per = dims.experts / config.ep;
  return {ep_rank * per, per};
}

}  // namespace ptc
