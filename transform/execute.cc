#include "transform/execute.h"

#include <algorithm>

#include "ptc/model_spec.h"
#include "ptc/store_reader.h"
#include "transform/parallel.h"

namespace ptc {
namespace {

bool Referenced(const TargetShard& t) { return t.kept || t.same; }

std::string MissingText(const Plan& plan) {
  std::string s;
  size_t shown = 0;
  for (const auto& [tensor, box] : plan.missing) {
    if (shown++ == 5) {
      s += ", ... (" + std::to_string(plan.missing.size()) + " regions in all)";
      break;
    }
    s += (s.empty() ? "" : ", ") + tensor + " " + box.ToString();
  }
  return s;
}

class Executor {
 public:
  Executor(GenerationWriter* writer, const GenerationReader& reader, const Plan& plan, const ExecuteOptions& options)
      : writer_(writer), reader_(reader), plan_(plan), options_(options), first_copy_(plan.targets.size() + 1) {
    // Copies are grouped by target: first_copy_[t] .. first_copy_[t+1].
    size_t c = 0;
    for (size_t t = 0; t < plan.targets.size(); ++t) {
      first_copy_[t] = c;
      while (c < plan.copies.size() && plan.copies[c].target == t) ++c;
    }
    first_copy_[plan.targets.size()] = c;
  }

  Status WriteTarget(size_t t) {
    const TargetShard& target = plan_.targets[t];
    PTC_ASSIGN_OR_RETURN(auto sink, writer_->NewShard(target.key.tensor, target.dtype, target.key.boxes, target.worker));
    const size_t elem = DTypeSize(target.dtype);
    std::vector<unsigned char> buf;
    for (const Box& box : target.key.boxes) {
      const Index rows = box.rank() ? box.end[0] - box.begin[0] : 1;
      const uint64_t row_bytes = rows ? box.volume() * elem / rows : 0;
      const Index step = std::max<Index>(1, row_bytes ? static_cast<Index>(options_.chunk_bytes / row_bytes) : rows);
      for (Index r = 0; r < rows; r += step) {
        Box chunk = box;
        if (box.rank()) chunk.begin[0] = box.begin[0] + r, chunk.end[0] = box.begin[0] + std::min(rows, r + step);
        buf.assign(chunk.volume() * elem, 0);
        PTC_RETURN_IF_ERROR(FillChunk(t, chunk, buf.data()));
        PTC_RETURN_IF_ERROR(sink->Append(buf.data(), buf.size()));
        if (options_.progress) options_.progress(buf.size());
      }
    }
    PTC_ASSIGN_OR_RETURN(ShardRecord record, sink->Finish());
    writer_->AddShard(std::move(record));
    return Status::OK();
  }

 private:
  Status FillChunk(size_t t, const Box& chunk, void* buf) {
    const auto& sources = reader_.manifest().shards;
    for (size_t c = first_copy_[t]; c < first_copy_[t + 1]; ++c) {
      const Copy& copy = plan_.copies[c];
      auto part = Intersect(copy.region, chunk);
      if (!part) continue;
      PTC_RETURN_IF_ERROR(reader_.ReadShard(sources[copy.source], *part, buf, chunk, DenseLayout(chunk)));
    }
    return Status::OK();
  }

  GenerationWriter* writer_;
  const GenerationReader& reader_;
  const Plan& plan_;
  const ExecuteOptions& options_;
  std::vector<size_t> first_copy_;
};

}  // namespace

uint64_t BytesToWrite(const Plan& plan) {
  uint64_t n = 0;
  for (const TargetShard& t : plan.targets) n += Referenced(t) ? 0 : t.nbytes;
  return n;
}

Result<ExecuteResult> ExecutePlan(Store& store, std::shared_ptr<const GenerationManifest> source,
                                  const ModelSpec& spec, const ParallelConfig& target, const Plan& plan,
                                  const ExecuteOptions& options) {
  if (!plan.missing.empty()) {
    return FailedPreconditionError("no live copy of: " + MissingText(plan) +
                                   "; bring the workers holding them back or restore an earlier generation");
  }
  PTC_ASSIGN_OR_RETURN(auto writer, store.BeginGeneration());
  GenerationReader reader(store, source, /*verify=*/true);
  ExecuteResult result;
  std::vector<size_t> to_write;
  for (size_t t = 0; t < plan.targets.size(); ++t) {
    const TargetShard& ts = plan.targets[t];
    if (!Referenced(ts)) {
      to_write.push_back(t);
      result.bytes_written += ts.nbytes;
      continue;
    }
    ShardRecord record = source->shards[ts.kept ? *ts.kept : *ts.same];
    record.worker = ts.worker;
    writer->AddShard(std::move(record));
    result.shards_referenced++;
  }
  Executor executor(writer.get(), reader, plan, options);
  PTC_RETURN_IF_ERROR(ParallelFor(to_write.size(), options.threads,
                                  [&](size_t i) { return executor.WriteTarget(to_write[i]); }));
  result.shards_written = to_write.size();
  GenerationManifest meta;
  meta.extra = source->extra;
  for (const auto& [key, value] : options.extra.items()) meta.extra[key] = value;
  PTC_RETURN_IF_ERROR(DescribeModel(spec, target, &meta));
  PTC_RETURN_IF_ERROR(writer->Commit(std::move(meta)));
  result.generation = writer->generation();
  return result;
}

Result<ExecuteResult> Transform(Store& store, const ParallelConfig& target, const ExecuteOptions& options,
                                const Topology& topology) {
  if (!store.has_generation()) return FailedPreconditionError(store.root() + ": the store holds no generation yet");
  std::shared_ptr<const GenerationManifest> source = store.CurrentSnapshot();
  PTC_ASSIGN_OR_RETURN(ModelSpec spec, SpecFromManifest(*source));
  PlanRequest request{source.get(), spec, target, topology, std::nullopt};
  PTC_ASSIGN_OR_RETURN(Plan plan, MakePlan(request));
  return ExecutePlan(store, source, spec, target, plan, options);
}

}  // namespace ptc
