#include "transform/execute.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "ptc/store/generation_writer.h"
#include "ptc/store/model_spec.h"
#include "ptc/store/store_reader.h"
#include "transform/covering.h"
#include "transform/parallel.h"
#include "transform/stream.h"

namespace ptc::transform {
namespace {

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

// The general path, for targets whose group StreamGroup cannot sweep (boxes
// not in row order): each target assembled chunk by chunk through a
// GenerationReader, which verifies a source shard (a separate read of the
// whole shard) before its first use.
class Executor {
 public:
  Executor(GenerationWriter* writer, const GenerationReader& reader, const Plan& plan,
           const std::vector<size_t>& first_copy, const ExecuteOptions& options)
      : writer_(writer), reader_(reader), plan_(plan), options_(options), first_copy_(first_copy) {}

  Status WriteTarget(size_t t, internal::Scratch* scratch) {
    const TargetShard& target = plan_.targets[t];
    PTC_ASSIGN_OR_RETURN(auto sink,
                         writer_->NewShard(target.key.tensor, target.dtype, target.key.boxes, target.worker));
    if (const ShardRecord* same = internal::VerbatimSource(plan_, first_copy_, t, reader_.manifest())) {
      PTC_RETURN_IF_ERROR(sink->AdoptChecksums(*same));  // the reader checks every byte against them
    }
    const size_t elem = DTypeSize(target.dtype);
    for (const Box& box : target.key.boxes) {
      const Index rows = box.rank() ? box.end[0] - box.begin[0] : 1;
      const uint64_t row_bytes = rows ? box.volume() * elem / rows : 0;
      const Index step = std::max<Index>(1, row_bytes ? static_cast<Index>(options_.chunk_bytes / row_bytes) : rows);
      for (Index r = 0; r < rows; r += step) {
        Box chunk = box;
        if (box.rank()) chunk.begin[0] = box.begin[0] + r, chunk.end[0] = box.begin[0] + std::min(rows, r + step);
        const size_t n = chunk.volume() * elem;
        char* buf = scratch->Get(n);
        PTC_RETURN_IF_ERROR(FillChunk(t, chunk, buf));
        PTC_RETURN_IF_ERROR(sink->Append(buf, n));
        PTC_RETURN_IF_ERROR(Advance(options_, n));
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
  const std::vector<size_t>& first_copy_;
};

// A unit of work for one thread: a streamable group, or one target of a group
// that is not.
struct Task {
  size_t group;
  std::optional<size_t> target;
  uint64_t bytes;
};

std::vector<Task> Tasks(const std::vector<internal::CopyGroup>& groups, const Plan& plan, bool sweep) {
  std::vector<Task> tasks;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (sweep && groups[g].streamable) {
      tasks.push_back({g, std::nullopt, groups[g].bytes});
      continue;
    }
    for (size_t t : groups[g].targets) tasks.push_back({g, t, plan.targets[t].nbytes});
  }
  // Largest first: the threads finish together.
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.bytes > b.bytes; });
  return tasks;
}

}  // namespace

Status Advance(const ExecuteOptions& options, uint64_t n) {
  if (options.progress) options.progress(n);
  if (options.cancelled && options.cancelled()) return FailedPreconditionError("cancelled");
  return Status::OK();
}

Result<ExecuteResult> ExecutePlan(Store& store, std::shared_ptr<const GenerationManifest> source, const ModelSpec& spec,
                                  const ParallelConfig& target, const Plan& plan, const ExecuteOptions& options) {
  if (!plan.missing.empty()) {
    return FailedPreconditionError("no live copy of: " + MissingText(plan) +
                                   "; bring the workers holding them back or restore an earlier generation");
  }
  return ExecuteCovering(store, source, spec, target, MakeCovering(plan, *source, options.mode), options);
}

Result<ExecuteResult> ExecuteCovering(Store& store, std::shared_ptr<const GenerationManifest> source,
                                      const ModelSpec& spec, const ParallelConfig& target, const Covering& covering,
                                      const ExecuteOptions& options) {
  PTC_ASSIGN_OR_RETURN(auto writer, store.BeginGeneration());
  if (!options.rank_files.empty()) writer->SetRankFiles(options.rank_files);
  for (const auto& [s, worker] : covering.references) {
    ShardRecord record = source->shards[s];
    record.worker = worker;
    writer->AddShard(std::move(record));
  }
  const Plan& writes = covering.writes;
  std::vector<size_t> to_write(writes.targets.size());
  std::iota(to_write.begin(), to_write.end(), 0);
  const std::vector<size_t> first_copy = internal::FirstCopies(writes);
  const std::vector<internal::CopyGroup> groups = internal::GroupTargets(writes, first_copy, to_write, *source);
  const std::vector<Task> tasks = Tasks(groups, writes, options.sweep);
  GenerationReader reader(store, source, /*verify=*/true);
  Executor executor(writer.get(), reader, writes, first_copy, options);
  std::vector<internal::Scratch> scratch(std::max(1, options.threads));
  PTC_RETURN_IF_ERROR(ParallelFor(tasks.size(), options.threads, [&](size_t i, int thread) -> Status {
    const Task& task = tasks[i];
    if (task.target) return executor.WriteTarget(*task.target, &scratch[thread]);
    return internal::StreamGroup(groups[task.group], writes, first_copy, store, *source, writer.get(), options,
                                 &scratch[thread]);
  }));
  if (options.before_commit) PTC_RETURN_IF_ERROR(options.before_commit(*writer));
  GenerationManifest meta;
  meta.extra = source->extra;
  for (const auto& [key, value] : options.extra.items()) meta.extra[key] = value;
  PTC_RETURN_IF_ERROR(DescribeModel(spec, target, &meta));
  PTC_RETURN_IF_ERROR(writer->Commit(std::move(meta)));
  ExecuteResult result;
  result.generation = writer->generation();
  result.shards_written = writes.targets.size();
  result.shards_referenced = covering.references.size();
  result.bytes_written = covering.bytes_written;
  result.bytes_referenced = covering.bytes_referenced;
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

Result<Compaction> PlanCompaction(const Store& store, CommitMode mode, bool box_targets) {
  if (!store.has_generation()) return FailedPreconditionError(store.root() + ": the store holds no generation yet");
  Compaction c;
  c.source = store.CurrentSnapshot();
  const std::string label = store.root() + ": generation " + std::to_string(c.source->generation);
  PTC_ASSIGN_OR_RETURN(c.spec, SpecFromManifest(*c.source), label);
  PTC_ASSIGN_OR_RETURN(c.config, ConfigFromManifest(*c.source), label);
  c.box_targets = box_targets;
  PTC_ASSIGN_OR_RETURN(Plan plan,
                       MakePlan({.source = c.source.get(),
                                 .spec = c.spec,
                                 .target = c.config,
                                 .alive = std::nullopt,
                                 .box_targets = box_targets}),
                       label);
  c.covering = MakeCovering(plan, *c.source, mode);
  return c;
}

Result<ExecuteResult> Compact(Store& store, const ExecuteOptions& options) {
  PTC_ASSIGN_OR_RETURN(Compaction c, PlanCompaction(store));
  if (c.covering.writes.targets.empty()) {
    ExecuteResult nothing;
    nothing.generation = c.source->generation;
    nothing.shards_referenced = c.covering.references.size();
    nothing.bytes_referenced = c.covering.bytes_referenced;
    return nothing;
  }
  return ExecuteCovering(store, c.source, c.spec, c.config, c.covering, options);
}

}  // namespace ptc::transform
