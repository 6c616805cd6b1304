#include "ptc/store/model_spec.h"

#include <string_view>
#include <unordered_map>

namespace ptc {

Status DescribeModel(const ModelSpec& spec, const ParallelConfig& config, GenerationManifest* m) {
  m->schema = spec.schema.ToJson();
  m->dims = spec.dims.ToString();
  m->config = config.ToString();
  m->tensors.clear();
  PTC_ASSIGN_OR_RETURN(std::vector<GlobalTensor> globals, GlobalTensors(spec));
  for (const GlobalTensor& g : globals) m->tensors.push_back({g.name, g.dtype, g.shape});
  m->extra["model"] = {{"dtype", DTypeName(spec.dtype)}, {"optimizer", spec.optimizer}};
  return Status::OK();
}

Result<ModelSpec> ModelOfManifest(const GenerationManifest& m) {
  const std::string where = "generation " + std::to_string(m.generation) + " manifest";
  ModelSpec spec;
  auto corrupt = [&](const Status& s) { return CorruptionError(where + ": " + s.message()); };
  if (m.tensors.empty() && m.schema.is_null()) {
    const bool dataset = m.extra.is_object() && m.extra.contains("dataset");
    return FailedPreconditionError("generation " + std::to_string(m.generation) + " holds " +
                                   (dataset ? "a dataset but no tensors" : "no tensors") +
                                   " (import a checkpoint first)");
  }
  auto schema = ParseSchema("schema", m.schema);
  if (!schema.ok()) return corrupt(schema.status());
  spec.schema = std::move(schema).value();
  auto dims = ParseDims(m.dims);
  if (!dims.ok()) return corrupt(dims.status());
  spec.dims = *dims;
  const nlohmann::json& model = m.extra.contains("model") ? m.extra["model"] : nlohmann::json();
  if (!model.is_object() || !model.contains("dtype") || !model["dtype"].is_string() || !model.contains("optimizer") ||
      !model["optimizer"].is_boolean()) {
    return CorruptionError(where + ": extra.model must hold \"dtype\" and \"optimizer\"");
  }
  auto dtype = ParseDType(model["dtype"].get<std::string>());
  if (!dtype.ok()) return corrupt(dtype.status());
  spec.dtype = *dtype;
  spec.optimizer = model["optimizer"].get<bool>();
  return spec;
}

Result<ModelSpec> SpecFromManifest(const GenerationManifest& m) {
  PTC_ASSIGN_OR_RETURN(ModelSpec spec, ModelOfManifest(m));
  const std::string where = "generation " + std::to_string(m.generation) + " manifest";
  Result<std::vector<GlobalTensor>> globals = GlobalTensors(spec);
  if (!globals.ok()) return CorruptionError(where + ": dims '" + m.dims + "': " + globals.status().message());
  const std::vector<std::string> problems = TensorTableProblems(m, *globals);
  if (!problems.empty()) {
    return CorruptionError(where + ": " + problems.front() +
                           (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more)" : ""));
  }
  return spec;
}

std::vector<std::string> TensorTableProblems(const GenerationManifest& m, const std::vector<GlobalTensor>& globals) {
  std::vector<std::string> problems;
  std::unordered_map<std::string_view, const TensorRecord*> recorded;
  for (const TensorRecord& t : m.tensors) recorded.emplace(t.name, &t);
  for (const GlobalTensor& g : globals) {
    auto it = recorded.find(g.name);
    if (it == recorded.end()) {
      problems.push_back("tensor '" + g.name + "': the schema and dims give it, the manifest does not list it");
      continue;
    }
    const TensorRecord& t = *it->second;
    if (t.dtype != g.dtype) {
      problems.push_back("tensor '" + g.name + "': dtype " + std::string(DTypeName(t.dtype)) +
                         " in the manifest, the model gives " + std::string(DTypeName(g.dtype)));
    }
    if (t.shape != g.shape) {
      problems.push_back("tensor '" + g.name + "': shape " + ShapeToString(t.shape) + " in the manifest, but dims '" +
                         m.dims + "' give " + ShapeToString(g.shape));
    }
    recorded.erase(it);
  }
  for (const TensorRecord& t : m.tensors) {
    if (recorded.count(t.name)) problems.push_back("tensor '" + t.name + "': in the manifest but not in the schema");
  }
  return problems;
}

Result<ParallelConfig> ConfigFromManifest(const GenerationManifest& m) {
  auto config = ParseConfig(m.config);
  if (!config.ok()) {
    return CorruptionError("generation " + std::to_string(m.generation) + " manifest: " + config.status().message());
  }
  return config;
}

}  // namespace ptc
