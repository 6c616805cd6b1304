// The model a stored generation holds, recorded in the generation manifest
// next to the opaque schema, dims and config the store keeps.
#pragma once

#include "ptc/model/config.h"
#include "ptc/model/view.h"
#include "ptc/store/manifest.h"

namespace ptc {

// Fills schema, dims, config, the tensor table and extra["model"] of `m`.
// \error as GlobalTensors.
Status DescribeModel(const ModelSpec& spec, const ParallelConfig& config, GenerationManifest* m);

// The inverse: the model and config a manifest describes, its tensor table
// checked against the tensors the model gives (a tampered shape or dtype would
// otherwise be served or exported as the model's).
// \error Corruption naming the manifest field that does not parse, or the
//        first tensor whose record differs (TensorTableProblems).
Result<ModelSpec> SpecFromManifest(const GenerationManifest& m);
// SpecFromManifest without the tensor table check (`ptcfs verify`, which
// lists every problem).
Result<ModelSpec> ModelOfManifest(const GenerationManifest& m);
// The differences between the tensor table of `m` and the tensors `globals`
// of its model, one line each, naming the tensor (empty: none).
std::vector<std::string> TensorTableProblems(const GenerationManifest& m, const std::vector<GlobalTensor>& globals);
Result<ParallelConfig> ConfigFromManifest(const GenerationManifest& m);

}  // namespace ptc
