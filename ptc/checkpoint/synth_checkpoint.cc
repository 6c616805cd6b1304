#include "ptc/checkpoint/synth_checkpoint.h"

#include "ptc/model/synth.h"

namespace ptc {

Status WriteSynthCheckpoint(Env* env, const ModelLayout& layout, uint64_t seed, const std::string& dir,
                            const ProgressFn& progress) {
  const ModelSpec& spec = layout.spec();
  PTC_RETURN_IF_ERROR(CheckCheckpointWrite(env, layout, CheckpointFormat::kSafetensors, dir));
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
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    PTC_ASSIGN_OR_RETURN(RankView view, layout.View(rank));
    PTC_RETURN_IF_ERROR(WriteRankCheckpoint(*out, layout.config(), view, fill, progress));
  }
  return Status::OK();
}

Result<uint64_t> CheckpointBytes(const ModelLayout& layout) {
  uint64_t total = 0;
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    PTC_ASSIGN_OR_RETURN(RankView view, layout.View(rank));
    for (const auto* list : {&view.model, &view.optim}) {
      for (const LocalTensor& t : *list) total += NumElements(t.shape) * DTypeSize(t.dtype);
    }
  }
  return total;
}

}  // namespace ptc
