#include "ptc/model/schema.h"

#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "ptc/base/regular_file.h"
#include "ptc/model/builtin_schemas.h"
#include "ptc/model/tensor_name.h"

namespace ptc {
namespace {

using nlohmann::json;

std::string_view PpName(PpPlacement p) {
  switch (p) {
    case PpPlacement::kLayer:
      return "layer";
    case PpPlacement::kFirst:
      return "first";
    case PpPlacement::kLast:
      return "last";
  }
  return "?";
}

Result<std::string> Formula(const json& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer() && v.get<int64_t>() > 0) return std::to_string(v.get<int64_t>());
  return InvalidArgumentError(where + ": shape entries must be formulas (strings) or integers");
}

std::string_view LayerKindName(LayerKind k) {
  switch (k) {
    case LayerKind::kAll:
      return "all";
    case LayerKind::kDense:
      return "dense";
    case LayerKind::kMoe:
      return "moe";
  }
  return "?";
}

// "layers", "{e}" and "when" of a rule whose name and pp are parsed.
Status ParseMoeFields(const std::string& where, const json& r, TensorRule* rule) {
  if (r.contains("layers")) {
    const json& v = r["layers"];
    const std::string kind = v.is_string() ? v.get<std::string>() : "";
    if (kind == "all")
      rule->layers = LayerKind::kAll;
    else if (kind == "dense")
      rule->layers = LayerKind::kDense;
    else if (kind == "moe")
      rule->layers = LayerKind::kMoe;
    else
      return InvalidArgumentError(where + ": layers must be \"all\", \"dense\" or \"moe\"");
    if (rule->pp != PpPlacement::kLayer) {
      return InvalidArgumentError(where + ": \"layers\" needs pp \"layer\"");
    }
  }
  if (const size_t e = rule->name.find("{e}"); e != std::string::npos) {
    if (rule->name.find("{e}", e + 1) != std::string::npos) {
      return InvalidArgumentError(where + ": {e} (the expert id) may appear once");
    }
    if (rule->pp != PpPlacement::kLayer || rule->layers == LayerKind::kDense) {
      return InvalidArgumentError(where + ": an expert rule ({e}) is per layer, on the MoE layers (pp \"layer\")");
    }
    rule->expert = true;
    rule->layers = LayerKind::kMoe;
  }
  if (r.contains("when")) {
    if (!r["when"].is_string() || r["when"].get<std::string>().empty()) {
      return InvalidArgumentError(where + ": when must be a formula (a string) over the dims");
    }
    rule->when = r["when"].get<std::string>();
  }
  return Status::OK();
}

Result<TensorRule> ParseRule(const std::string& label, size_t index, const json& r) {
  std::string where = label + ": tensors[" + std::to_string(index) + "]";
  if (!r.is_object()) return InvalidArgumentError(where + ": must be an object");
  for (const auto& [key, _] : r.items()) {
    if (key != "name" && key != "shape" && key != "tp" && key != "pp" && key != "tied_to" && key != "layers" &&
        key != "when" && key != "buffer") {
      return InvalidArgumentError(where + ": unknown field '" + key + "'");
    }
  }
  TensorRule rule;
  if (!r.contains("name") || !r["name"].is_string() || r["name"].get<std::string>().empty()) {
    return InvalidArgumentError(where + ": needs a non-empty string \"name\"");
  }
  rule.name = r["name"].get<std::string>();
  {
    // Names become file names: check the name a layer gives ({i} -> 0), and
    // leave room for the layer index and optimizer suffixes.
    std::string expanded = rule.name;
    if (size_t at = expanded.find("{i}"); at != std::string::npos) expanded.replace(at, 3, "0");
    if (size_t at = expanded.find("{e}"); at != std::string::npos) expanded.replace(at, 3, "0");
    PTC_RETURN_IF_ERROR(ValidateTensorName(expanded, where));
    if (rule.name.size() + 32 > kMaxTensorNameBytes) {
      return InvalidArgumentError(where + ": name is " + std::to_string(rule.name.size()) + " bytes long (at most " +
                                  std::to_string(kMaxTensorNameBytes - 32) + ")");
    }
  }
  where = label + ": rule '" + rule.name + "'";
  if (r.contains("tied_to")) {
    if (!r["tied_to"].is_string()) return InvalidArgumentError(where + ": tied_to must be a string");
    rule.tied_to = r["tied_to"].get<std::string>();
  }
  if (r.contains("shape")) {
    if (!r["shape"].is_array()) return InvalidArgumentError(where + ": shape must be an array");
    for (const json& s : r["shape"]) {
      PTC_ASSIGN_OR_RETURN(std::string f, Formula(s, where));
      rule.shape.push_back(std::move(f));
    }
  } else if (rule.tied_to.empty()) {
    return InvalidArgumentError(where + ": needs \"shape\"");
  }
  if (r.contains("pp") && !r["pp"].is_string()) return InvalidArgumentError(where + ": pp must be a string");
  const std::string pp = r.value("pp", std::string("layer"));
  if (pp == "layer")
    rule.pp = PpPlacement::kLayer;
  else if (pp == "first")
    rule.pp = PpPlacement::kFirst;
  else if (pp == "last")
    rule.pp = PpPlacement::kLast;
  else
    return InvalidArgumentError(where + ": pp '" + pp + "' is not one of layer, first, last");
  bool has_i = rule.name.find("{i}") != std::string::npos;
  if (has_i != (rule.pp == PpPlacement::kLayer)) {
    return InvalidArgumentError(where + ": a name contains {i} exactly when pp is \"layer\"");
  }
  PTC_RETURN_IF_ERROR(ParseMoeFields(where, r, &rule));
  if (r.contains("buffer")) {
    if (!r["buffer"].is_boolean()) {
      return InvalidArgumentError(where + ": buffer must be true or false (true: model state without optimizer state)");
    }
    rule.buffer = r["buffer"].get<bool>();
  }
  if (r.contains("tp")) {
    const json& tp = r["tp"];
    if (!tp.is_object() || !tp.contains("dim") || !tp["dim"].is_number_integer() || tp["dim"].get<int64_t>() < 0 ||
        tp["dim"].get<int64_t>() > 64) {
      return InvalidArgumentError(where + ": tp must be an object with an integer \"dim\"");
    }
    rule.tp.split = true;
    rule.tp.dim = tp["dim"].get<int>();
    if (tp.contains("segments")) {
      if (!tp["segments"].is_number_integer() || tp["segments"].get<int64_t>() < 1 ||
          tp["segments"].get<int64_t>() > 1024) {
        return InvalidArgumentError(where + ": tp.segments must be a positive integer");
      }
      rule.tp.segments = tp["segments"].get<int>();
    }
    if (tp.contains("units")) {
      PTC_ASSIGN_OR_RETURN(rule.tp.units, Formula(tp["units"], where));
    }
    if (!rule.shape.empty() && rule.tp.dim >= static_cast<int>(rule.shape.size())) {
      return InvalidArgumentError(where + ": tp.dim " + std::to_string(rule.tp.dim) + " is outside its " +
                                  std::to_string(rule.shape.size()) + "-d shape");
    }
  }
  return rule;
}

}  // namespace

const TensorRule* Schema::Find(std::string_view name) const {
  for (const TensorRule& r : rules) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

json Schema::ToJson() const {
  json tensors = json::array();
  for (const TensorRule& r : rules) {
    json j = {{"name", r.name}, {"pp", PpName(r.pp)}};
    if (!r.shape.empty()) j["shape"] = r.shape;
    if (r.tp.split) {
      j["tp"] = {{"dim", r.tp.dim}};
      if (r.tp.segments != 1) j["tp"]["segments"] = r.tp.segments;
      if (!r.tp.units.empty()) j["tp"]["units"] = r.tp.units;
    }
    if (!r.tied_to.empty()) j["tied_to"] = r.tied_to;
    if (r.layers != LayerKind::kAll && !r.expert) j["layers"] = LayerKindName(r.layers);
    if (!r.when.empty()) j["when"] = r.when;
    if (r.buffer) j["buffer"] = true;
    tensors.push_back(std::move(j));
  }
  return json{{"name", name}, {"tensors", std::move(tensors)}};
}

Result<Schema> ParseSchema(std::string_view label_view, const json& doc) {
  const std::string label(label_view);
  if (!doc.is_object() || !doc.contains("tensors") || !doc["tensors"].is_array()) {
    return InvalidArgumentError(label + ": a schema is an object with a \"tensors\" array");
  }
  Schema s;
  s.name = doc.contains("name") && doc["name"].is_string() ? doc["name"].get<std::string>() : label;
  std::unordered_map<std::string, size_t> index;  // of each rule, by name
  const json& tensors = doc["tensors"];
  for (size_t i = 0; i < tensors.size(); ++i) {
    PTC_ASSIGN_OR_RETURN(TensorRule rule, ParseRule(label, i, tensors[i]));
    if (!index.emplace(rule.name, s.rules.size()).second) {
      return InvalidArgumentError(label + ": rule '" + rule.name + "' appears twice");
    }
    s.rules.push_back(std::move(rule));
  }
  if (s.rules.empty()) return InvalidArgumentError(label + ": schema has no tensors");
  for (TensorRule& rule : s.rules) {
    if (rule.tied_to.empty()) continue;
    auto found = index.find(rule.tied_to);
    const TensorRule* target = found == index.end() ? nullptr : &s.rules[found->second];
    if (target == nullptr || target->pp == PpPlacement::kLayer || !target->tied_to.empty()) {
      return InvalidArgumentError(label + ": rule '" + rule.name + "': tied_to '" + rule.tied_to +
                                  "' must name a first- or last-stage rule that is not itself tied");
    }
    if (rule.pp == PpPlacement::kLayer) {
      return InvalidArgumentError(label + ": rule '" + rule.name + "': a tied rule cannot be per layer");
    }
    if (!rule.when.empty() || !target->when.empty()) {
      return InvalidArgumentError(label + ": rule '" + rule.name + "': a tied rule and its target take no \"when\"");
    }
    if (rule.buffer || target->buffer) {
      return InvalidArgumentError(label + ": rule '" + rule.name +
                                  "': a tied rule and its target take no \"buffer\" (tied embeddings are parameters)");
    }
    if (rule.shape.empty()) rule.shape = target->shape;
    if (rule.shape != target->shape) {
      return InvalidArgumentError(label + ": rule '" + rule.name + "': shape differs from its tied rule");
    }
    if (rule.tp.split && rule.tp.dim >= static_cast<int>(rule.shape.size())) {
      return InvalidArgumentError(label + ": rule '" + rule.name + "': tp.dim is outside the shape");
    }
  }
  return s;
}

std::vector<std::string> BuiltinSchemaNames() { return {"megatron-gpt", "llama"}; }

Result<Schema> LoadSchema(const std::string& name_or_path) {
  if (std::string_view text = BuiltinSchemaText(name_or_path); !text.empty()) {
    return ParseSchema(name_or_path, json::parse(text));
  }
  Result<std::string> text = ReadRegularFile(name_or_path);  // a FIFO is refused, not waited on
  if (text.status().code() == Code::kNotFound) {
    return NotFoundError("schema '" + name_or_path +
                         "' is neither a built-in (megatron-gpt, llama) nor a readable file");
  }
  PTC_RETURN_IF_ERROR(text.status().WithContext("schema"));
  json doc = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return InvalidArgumentError(name_or_path + ": not valid JSON");
  return ParseSchema(name_or_path, doc);
}

}  // namespace ptc
