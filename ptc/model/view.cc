#include "ptc/model/view.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "ptc/model/expr.h"
#include "ptc/model/limits.h"
#include "ptc/model/rule_layers.h"

namespace ptc {
namespace {

// `pattern` with {i} the layer and {e} the expert.
std::string Substitute(const std::string& pattern, Index layer, Index expert = 0) {
  std::string s = pattern;
  size_t pos = s.find("{i}");
  if (pos != std::string::npos) s.replace(pos, 3, std::to_string(layer));
  pos = s.find("{e}");
  if (pos != std::string::npos) s.replace(pos, 3, std::to_string(expert));
  return s;
}

VariableLookup DimsLookup(const ModelDims& dims) {
  return [&dims](std::string_view name) { return dims.Lookup(name); };
}

// The global tensor a rule's placement holds, for global layer `layer` (and expert).
std::string GlobalName(const TensorRule& rule, Index layer, Index expert) {
  return rule.tied_to.empty() ? Substitute(rule.name, layer, expert) : rule.tied_to;
}

bool PlacedOn(const TensorRule& rule, int stage, int pp) {
  return rule.pp == PpPlacement::kFirst ? stage == 0 : stage == pp - 1;
}

// One parameter placement: its local tensor (F32 or the model dtype) and the
// origin of each segment inside it.
struct Placement {
  LocalTensor local;
  std::vector<std::vector<Index>> origins;  // local coordinates of each segment's box.begin
  bool expert = false;                      // an expert's (ZeRO-1 cuts it over edp)
};

// `rule`'s tensor of `shape` split over `parts` ranks (tp, or etp for an
// expert), the part of rank `part_rank`.
Placement Place(const TensorRule& rule, const Shape& shape, std::string global, std::string local_name, DType dtype,
                int parts, int part_rank) {
  Placement p;
  p.local.name = std::move(local_name);
  p.local.dtype = dtype;
  p.local.buffer = rule.buffer;
  p.expert = rule.expert;
  if (!rule.tp.split || parts == 1) {
    p.local.shape = shape;
    p.local.segments.push_back({global, Box::Full(shape), DenseLayout(Box::Full(shape))});
    p.origins.push_back(std::vector<Index>(shape.size(), 0));
    return p;
  }
  const int d = rule.tp.dim;
  const Index seg = shape[d] / rule.tp.segments, part = seg / parts;
  p.local.shape = shape;
  p.local.shape[d] = part * rule.tp.segments;
  const std::vector<Index> strides = RowMajorStrides(p.local.shape);
  for (int k = 0; k < rule.tp.segments; ++k) {
    Box box = Box::Full(shape);
    box.begin[d] = k * seg + part_rank * part;
    box.end[d] = box.begin[d] + part;
    std::vector<Index> origin(shape.size(), 0);
    origin[d] = k * part;
    p.local.segments.push_back({global, box, Layout{origin[d] * strides[d], strides}});
    p.origins.push_back(origin);
  }
  return p;
}

// Placements of the parameters on pipeline stage coords.pp, in module order:
// first-stage tensors, then each layer, then last-stage tensors. In a layer,
// a run of consecutive expert rules is laid out expert by expert (expert 0's
// fc1, fc2, then expert 1's ...), as Megatron-Core registers them.
Result<std::vector<Placement>> PlaceParameters(const ModelSpec& spec, const ParallelConfig& config,
                                               const RankCoords& coords) {
  std::vector<Placement> out;
  std::unordered_map<const TensorRule*, Shape> shapes;  // each rule's, evaluated once (a rank holds many experts)
  auto add = [&](const TensorRule& rule, Index global_layer, Index local_layer, Index global_expert = 0,
                 Index local_expert = 0) -> Status {
    auto [at, fresh] = shapes.try_emplace(&rule);
    if (fresh) {
      PTC_ASSIGN_OR_RETURN(at->second, RuleShape(rule, spec.dims));
    }
    const Shape& shape = at->second;
    const int parts = rule.expert ? config.expert_tp() : config.tp;
    const int part_rank = rule.expert ? coords.etp : coords.tp;
    out.push_back(Place(rule, shape, GlobalName(rule, global_layer, global_expert),
                        Substitute(rule.name, local_layer, local_expert), spec.dtype, parts, part_rank));
    return Status::OK();
  };
  // The rules that exist for these dims ("when"), in schema order.
  std::vector<const TensorRule*> rules;
  for (const TensorRule& rule : spec.schema.rules) {
    PTC_ASSIGN_OR_RETURN(bool when, RuleWhen(rule, spec.dims));
    if (when) rules.push_back(&rule);
  }
  std::unordered_map<std::string_view, const TensorRule*> by_name;  // tied_to targets (ParseSchema checked them)
  for (const TensorRule& rule : spec.schema.rules) by_name.emplace(rule.name, &rule);
  auto add_stage_rules = [&](PpPlacement which) -> Status {
    for (const TensorRule* rule : rules) {
      if (rule->pp != which || !PlacedOn(*rule, coords.pp, config.pp)) continue;
      if (!rule->tied_to.empty() && PlacedOn(*by_name.at(rule->tied_to), coords.pp, config.pp)) continue;
      PTC_RETURN_IF_ERROR(add(*rule, 0, 0));
    }
    return Status::OK();
  };
  PTC_RETURN_IF_ERROR(add_stage_rules(PpPlacement::kFirst));
  auto [first, count] = StageLayers(config, spec.dims.layers, coords.pp);
  const auto [first_expert, experts] =
      spec.dims.experts ? RankExperts(spec.dims, config, coords.ep) : std::pair<Index, Index>{0, 0};
  for (Index i = 0; i < count; ++i) {
    for (size_t r = 0; r < rules.size(); ++r) {
      const TensorRule& rule = *rules[r];
      if (rule.pp != PpPlacement::kLayer || !RuleOnLayer(rule, spec.dims, first + i)) continue;
      if (!rule.expert) {
        PTC_RETURN_IF_ERROR(add(rule, first + i, i));
        continue;
      }
      size_t end = r;  // the run of expert rules [r, end)
      while (end < rules.size() && rules[end]->expert) ++end;
      for (Index e = 0; e < experts; ++e) {
        for (size_t k = r; k < end; ++k) PTC_RETURN_IF_ERROR(add(*rules[k], first + i, i, first_expert + e, e));
      }
      r = end - 1;
    }
  }
  PTC_RETURN_IF_ERROR(add_stage_rules(PpPlacement::kLast));
  return out;
}

LocalTensor OptimizerTensor(const LocalTensor& param, const char* kind) {
  LocalTensor t = param;
  t.name += std::string(".") + kind;
  t.dtype = DType::kF32;
  for (Segment& s : t.segments) s.tensor += std::string(".") + kind;
  return t;
}

// ZeRO-1: the rank's piece of the flat buffer that concatenates the local
// shards of the rank's dense parameters (or of its experts', `experts`),
// padded to a multiple of `ranks` (the dp x cp group, or the edp group) and cut
// into that many pieces; piece `index` is the rank's.
LocalTensor ZeroPiece(const std::vector<Placement>& params, bool experts, int ranks, int index, const char* kind) {
  // The rank's parameters of this buffer (no model buffer: those have no optimizer state).
  auto in_buffer = [experts](const Placement& p) { return p.expert == experts && HasOptimizerState(p.local); };
  Index total = 0;
  for (const Placement& p : params) {
    if (in_buffer(p)) total += NumElements(p.local.shape);
  }
  const Index piece = (total + ranks - 1) / ranks;
  const Index lo = index * piece, hi = lo + piece;
  LocalTensor t{std::string(experts ? "optimizer.experts." : "optimizer.") + kind, DType::kF32, Shape{piece}, {}};
  Index base = 0;
  for (const Placement& p : params) {
    if (!in_buffer(p)) continue;
    const Index n = NumElements(p.local.shape);
    const Index a = std::max(lo, base), b = std::min(hi, base + n);
    if (a < b) {
      const std::vector<Index> strides = RowMajorStrides(p.local.shape);
      for (const Box& local_box : FlatRangeToBoxes(p.local.shape, a - base, b - base)) {
        for (size_t k = 0; k < p.local.segments.size(); ++k) {
          const Segment& seg = p.local.segments[k];
          const Box seg_local = Translate(Box::Full(seg.box.shape()), p.origins[k]);
          auto hit = Intersect(seg_local, local_box);
          if (!hit) continue;
          std::vector<Index> delta(hit->rank());
          Index offset = base - lo;
          for (size_t d = 0; d < hit->rank(); ++d) {
            delta[d] = seg.box.begin[d] - p.origins[k][d];
            offset += hit->begin[d] * strides[d];
          }
          t.segments.push_back({seg.tensor + "." + kind, Translate(*hit, delta), Layout{offset, strides}});
        }
      }
    }
    base += n;
  }
  return t;
}

// The rules of experts against the config, each once: ep and etp need a
// model with experts, experts need expert rules, ep divides experts.
// (The grid rule is CheckExpertGrid; etp dividing an expert's split dim is
// ValidateConfig's tp check, made over etp for expert rules.)
Status ValidateExperts(const ModelSpec& spec, const ParallelConfig& config) {
  const std::string c = "config " + config.ToString();
  const Index experts = spec.dims.experts;
  if (experts == 0) {
    if (config.ep > 1) {
      return InvalidArgumentError(c + ": ep=" + std::to_string(config.ep) +
                                  " needs a mixture-of-experts model (dims experts=), and the model is dense");
    }
    if (config.etp != 0) {
      return InvalidArgumentError(c + ": etp=" + std::to_string(config.etp) +
                                  " needs a mixture-of-experts model (dims experts=), and the model is dense");
    }
    return Status::OK();
  }
  const bool has_expert_rule = std::any_of(spec.schema.rules.begin(), spec.schema.rules.end(),
                                           [](const TensorRule& r) { return r.expert; });
  if (!has_expert_rule) {
    return InvalidArgumentError("schema '" + spec.schema.name + "' has no expert rule ({e} in a name) for experts=" +
                                std::to_string(experts) + " (use a schema with MoE rules, e.g. llama)");
  }
  if (experts % config.ep != 0) {
    return InvalidArgumentError(c + ": ep=" + std::to_string(config.ep) + " does not divide experts=" +
                                std::to_string(experts) + " (each ep rank holds experts/ep whole experts)");
  }
  return Status::OK();
}

}  // namespace

Result<Shape> RuleShape(const TensorRule& rule, const ModelDims& dims) {
  Shape shape;
  for (const std::string& f : rule.shape) {
    PTC_ASSIGN_OR_RETURN(Index v, EvalExpr(f, DimsLookup(dims)), "rule '" + rule.name + "'");
    if (v <= 0) {
      return InvalidArgumentError("rule '" + rule.name + "': shape formula '" + f + "' gives " + std::to_string(v));
    }
    shape.push_back(v);
  }
  return shape;
}

std::vector<ShardKey> StoredShards(const LocalTensor& local) {
  std::vector<ShardKey> keys;
  // A ZeRO-1 piece has segments of every parameter of the rank.
  std::unordered_map<std::string_view, size_t> index;  // of each key, by tensor
  for (const Segment& s : local.segments) {
    auto [at, fresh] = index.try_emplace(s.tensor, keys.size());
    if (fresh) keys.push_back(ShardKey{s.tensor, {}});
    keys[at->second].boxes.push_back(s.box);
  }
  return keys;
}

std::pair<Index, Index> StageLayers(const ParallelConfig& config, Index layers, int stage) {
  if (config.pp_layers.empty()) {
    const Index per = layers / config.pp;
    return {stage * per, per};
  }
  Index first = 0;
  for (int s = 0; s < stage; ++s) first += config.pp_layers[s];
  return {first, config.pp_layers[stage]};
}

Result<std::vector<GlobalTensor>> GlobalTensors(const ModelSpec& spec) {
  std::vector<GlobalTensor> params;
  std::vector<const TensorRule*> rules;  // those whose "when" holds
  for (const TensorRule& rule : spec.schema.rules) {
    PTC_ASSIGN_OR_RETURN(bool when, RuleWhen(rule, spec.dims));
    if (when) rules.push_back(&rule);
  }
  for (PpPlacement which : {PpPlacement::kFirst, PpPlacement::kLayer, PpPlacement::kLast}) {
    if (which == PpPlacement::kLayer) {
      for (Index l = 0; l < spec.dims.layers; ++l) {
        for (size_t r = 0; r < rules.size(); ++r) {
          const TensorRule& rule = *rules[r];
          if (rule.pp != which || !RuleOnLayer(rule, spec.dims, l)) continue;
          size_t end = r + 1;  // a run of expert rules, laid out expert by expert as the views do
          while (rule.expert && end < rules.size() && rules[end]->expert) ++end;
          for (Index e = 0; e < (rule.expert ? spec.dims.experts : 1); ++e) {
            for (size_t k = r; k < end; ++k) {
              PTC_ASSIGN_OR_RETURN(Shape shape, RuleShape(*rules[k], spec.dims));
              params.push_back({Substitute(rules[k]->name, l, e), spec.dtype, shape, rules[k]->buffer});
            }
          }
          r = end - 1;
        }
      }
      continue;
    }
    for (const TensorRule* rule : rules) {
      if (rule->pp != which || !rule->tied_to.empty()) continue;
      PTC_ASSIGN_OR_RETURN(Shape shape, RuleShape(*rule, spec.dims));
      params.push_back({Substitute(rule->name, 0), spec.dtype, shape, rule->buffer});
    }
  }
  std::vector<GlobalTensor> out = params;
  if (spec.optimizer) {
    for (const GlobalTensor& p : params) {
      if (!HasOptimizerState(p)) continue;
      for (const char* kind : kOptimizerKinds) out.push_back({p.name + "." + kind, DType::kF32, p.shape});
    }
  }
  return out;
}

Status ValidateConfig(const ModelSpec& spec, const ParallelConfig& config) {
  const std::string c = "config " + config.ToString();
  if (config.tp < 1 || config.pp < 1 || config.dp < 1 || config.cp < 1 || config.ep < 1 || config.etp < 0 ||
      config.per_worker < 1) {
    return InvalidArgumentError(c + ": degrees and per_worker must be positive");
  }
  PTC_RETURN_IF_ERROR(CheckExpertGrid(config));
  PTC_RETURN_IF_ERROR(CheckLayoutLimits(spec, config));  // before anything is built for the config
  if (!config.workers.empty()) {
    std::vector<int> sorted = config.workers;
    std::sort(sorted.begin(), sorted.end());
    if (static_cast<int>(sorted.size()) != config.num_workers() || sorted.front() < 0 ||
        std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return InvalidArgumentError(c + ": workers must name " + std::to_string(config.num_workers()) +
                                  " distinct workers, one per slot of per_worker ranks");
    }
  }
  if (config.replicas < 1 || config.replicas > config.num_workers()) {
    return InvalidArgumentError(c + ": replicas must be from 1 to the " + std::to_string(config.num_workers()) +
                                " workers holding ranks");
  }
  if (config.pp_layers.empty()) {
    if (spec.dims.layers % config.pp != 0) {
      return InvalidArgumentError(c + ": pp=" + std::to_string(config.pp) + " does not divide layers=" +
                                  std::to_string(spec.dims.layers) + " (give pp_layers=a+b+... for uneven stages)");
    }
  } else {
    Index sum = 0;
    for (int n : config.pp_layers) sum += n;
    if (static_cast<int>(config.pp_layers.size()) != config.pp || sum != spec.dims.layers) {
      return InvalidArgumentError(c + ": pp_layers must list pp=" + std::to_string(config.pp) +
                                  " stage sizes summing to layers=" + std::to_string(spec.dims.layers));
    }
  }
  PTC_RETURN_IF_ERROR(ValidateExperts(spec, config));
  for (const TensorRule& rule : spec.schema.rules) {
    if (!rule.tp.split) continue;
    PTC_ASSIGN_OR_RETURN(uint64_t tensors, RuleTensors(rule, spec.dims), c);
    if (tensors == 0) continue;  // no tensor for these dims (an MoE rule of a dense model, "when")
    PTC_ASSIGN_OR_RETURN(Shape shape, RuleShape(rule, spec.dims));
    const Index size = shape[rule.tp.dim];
    const std::string r = c + ": rule '" + rule.name + "'";
    // An expert's matrices are split over etp, the rest over tp.
    const int parts = rule.expert ? config.expert_tp() : config.tp;
    const std::string axis = rule.expert ? "etp" : "tp";
    if (size % rule.tp.segments != 0) {
      return InvalidArgumentError(r + ": dim " + std::to_string(rule.tp.dim) + " of size " + std::to_string(size) +
                                  " does not split into " + std::to_string(rule.tp.segments) + " segments");
    }
    const Index seg = size / rule.tp.segments;
    Index units = seg;
    if (!rule.tp.units.empty()) {
      PTC_ASSIGN_OR_RETURN(units, EvalExpr(rule.tp.units, DimsLookup(spec.dims)), r);
      if (units <= 0 || seg % units != 0) {
        return InvalidArgumentError(r + ": " + std::to_string(seg) + " elements do not form " + std::to_string(units) +
                                    " units of '" + rule.tp.units + "'");
      }
    }
    if (units % parts != 0) {
      std::string what = !rule.tp.units.empty()  ? rule.tp.units + "=" + std::to_string(units)
                         : rule.tp.segments == 1 ? rule.shape[rule.tp.dim] + "=" + std::to_string(seg)
                                                 : "(" + rule.shape[rule.tp.dim] + ")/" +
                                                       std::to_string(rule.tp.segments) + "=" + std::to_string(seg);
      return InvalidArgumentError(r + ": " + axis + "=" + std::to_string(parts) + " does not divide " + what);
    }
  }
  return Status::OK();
}

namespace internal {

Result<RankView> ComputeCheckedView(const ModelSpec& spec, const ParallelConfig& config, int rank) {
  RankView view;
  view.rank = rank;
  view.coords = config.CoordsOf(rank);
  PTC_ASSIGN_OR_RETURN(std::vector<Placement> params, PlaceParameters(spec, config, view.coords));
  // The optimizer state first: it reads the placements, which then move into view.model.
  auto take_model = [&] {
    view.model.reserve(params.size());
    for (Placement& p : params) view.model.push_back(std::move(p.local));
  };
  if (!spec.optimizer) {
    take_model();
    return view;
  }
  if (config.zero) {
    const RankCoords& c = view.coords;
    for (const char* kind : kOptimizerKinds) {
      view.optim.push_back(
          ZeroPiece(params, false, config.dense_zero_ranks(), ParallelConfig::DenseZeroIndex(c, config.cp), kind));
    }
    if (std::any_of(params.begin(), params.end(),
                    [](const Placement& p) { return p.expert && HasOptimizerState(p.local); })) {
      for (const char* kind : kOptimizerKinds) {
        view.optim.push_back(ZeroPiece(params, true, config.expert_dp(), c.edp, kind));
      }
    }
  } else {
    for (const Placement& p : params) {
      if (!HasOptimizerState(p.local)) continue;
      for (const char* kind : kOptimizerKinds) view.optim.push_back(OptimizerTensor(p.local, kind));
    }
  }
  take_model();
  return view;
}

}  // namespace internal

}  // namespace ptc
