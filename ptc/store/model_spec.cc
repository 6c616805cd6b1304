#include "ptc/store/model_spec.h"

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

Result<ModelSpec> SpecFromManifest(const GenerationManifest& m) {
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

Result<ParallelConfig> ConfigFromManifest(const GenerationManifest& m) {
  auto config = ParseConfig(m.config);
  if (!config.ok()) {
    return CorruptionError("generation " + std::to_string(m.generation) + " manifest: " + config.status().message());
  }
  return config;
}

}  // namespace ptc
