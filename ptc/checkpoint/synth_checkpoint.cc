#include "ptc/checkpoint/synth_checkpoint.h"

#include "ptc/model/synth.h"

namespace ptc {

Status WriteSynthCheckpoint(Env* env, const ModelSpec& spec, const ParallelConfig& config, uint64_t seed,
                            const std::string& dir, const ProgressFn& progress) {
  PTC_RETURN_IF_ERROR(CheckCheckpointWrite(env, spec, config, CheckpointFormat::kSafetensors, dir));
  PTC_ASSIGN_OR_RETURN(std::vector<GlobalTensor> globals, GlobalTensors(spec));
  std::map<std::string, Shape> shapes;
  for (const GlobalTensor& g : globals) shapes[g.name] = g.shape;
  auto fill = [&](const LocalTensor& t, void* buffer) -> Status {
    auto* out = static_cast<unsigned char*>(buffer);
    const size_t elem = DTypeSize(t.dtype);
    for (const Segment& s : t.segments) {
      const Box full = Box::Full(shapes.at(s.tensor));
      ForEachRun(s.box, full, DenseLayout(full), s.box, s.layout,
                 [&](Index g, Index l, Index n) { SynthValues(s.tensor, seed, t.dtype, g, n, out + l * elem, spec.dtype);
                 });
    }
    return Status::OK();
  };
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> out, env->OpenOutputDir(dir));
  for (int rank = 0; rank < config.world_size(); ++rank) {
    PTC_ASSIGN_OR_RETURN(RankView view, ComputeView(spec, config, rank));
    PTC_RETURN_IF_ERROR(WriteRankCheckpoint(*out, config, view, fill, progress));
  }
  return Status::OK();
}

Result<uint64_t> CheckpointBytes(const ModelSpec& spec, const ParallelConfig& config) {
  uint64_t total = 0;
  for (int rank = 0; rank < config.world_size(); ++rank) {
    PTC_ASSIGN_OR_RETURN(RankView view, ComputeView(spec, config, rank));
    for (const auto* list : {&view.model, &view.optim}) {
      for (const LocalTensor& t : *list) total += NumElements(t.shape) * DTypeSize(t.dtype);
    }
  }
  return total;
}

}  // namespace ptc
