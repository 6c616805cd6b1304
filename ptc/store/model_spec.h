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

// The inverse: the model and config a manifest describes.
// \error Corruption naming the manifest field that does not parse.
Result<ModelSpec> SpecFromManifest(const GenerationManifest& m);
Result<ParallelConfig> ConfigFromManifest(const GenerationManifest& m);

}  // namespace ptc
