// ptcfs plan / ptcfs transform: repartition the store for another config.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "cluster/job_state.h"
#include "ptc/base/json_fields.h"
#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/base/kv_text.h"
#include "ptc/store/model_spec.h"
#include "tools/cli_numbers.h"
#include "tools/commands.h"
#include "tools/progress.h"
#include "transform/execute.h"
#include "transform/layout_manifest.h"

namespace ptcfs {
namespace {

struct PlanArgs {
  std::string store, to, alive;
  // plan --from: the source from the model and a config alone, no store.
  std::string from, schema, dims, optimizer = "none", dtype = "f32";
  bool manifest_size = false;
  int workers_per_host = 1;
  int threads = 2;
  bool json = false;
  bool keep_old = false;
  bool wait = false;  // transform: for the writer lock
};

ptc::Result<std::optional<std::set<int>>> ParseAlive(const std::string& text) {
  if (text.empty()) return std::optional<std::set<int>>();
  std::set<int> alive;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item == "0") {
      alive.insert(0);
    } else {
      PTC_ASSIGN_OR_RETURN(int64_t w, ptc::ParsePositiveInt(item), "--alive");
      alive.insert(static_cast<int>(w));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return std::optional<std::set<int>>(alive);
}

nlohmann::json PlanJson(const ptc::transform::Plan& p, const ptc::transform::Covering& c, const std::string& from,
                        const std::string& to) {
  nlohmann::json messages = nlohmann::json::array();
  for (const auto& [link, bytes] : p.messages)
    messages.push_back({{"from", link.first}, {"to", link.second}, {"bytes", bytes}});
  nlohmann::json missing = nlohmann::json::array();
  for (const auto& [tensor, box] : p.missing) missing.push_back({{"tensor", tensor}, {"box", box.ToString()}});
  size_t kept = 0;
  for (const ptc::transform::TargetShard& t : p.targets) kept += t.kept.has_value();
  return {{"from", from},
          {"to", to},
          {"target_shards", p.targets.size()},
          {"kept_shards", kept},
          {"copies", p.copies.size()},
          {"bytes_total", p.bytes_total},
          {"bytes_kept", p.bytes_kept},
          {"bytes_local", p.bytes_local},
          {"bytes_moved", p.bytes_moved},
          {"lower_bound", p.lower_bound},
          {"bottleneck", p.bottleneck},
          {"bytes_to_write", c.bytes_written},
          {"pieces_referenced", c.references.size()},
          {"bytes_referenced", c.bytes_referenced},
          {"compact_bytes", c.compact_bytes},
          {"links", {{"local", p.links.local}, {"same_host", p.links.same_host}, {"cross_host", p.links.cross_host}}},
          {"messages", messages},
          {"missing", missing}};
}

// The store (none with --from), its current generation and the plan to `--to`.
struct Planned {
  std::unique_ptr<ptc::Store> store;
  std::shared_ptr<const ptc::GenerationManifest> source;
  ptc::ModelSpec spec;
  ptc::ParallelConfig to;
  ptc::transform::Plan plan;
  ptc::transform::Covering covering;  // what transform commits (CommitMode::kCovering)
  double seconds = 0;         // planning time
  double source_seconds = 0;  // --from: building the source manifest
};

// --from: the source generation a store of --schema/--dims in config --from
// would hold (transform/layout_manifest.h), no tensor data.
ptc::Status SourceFromDims(const PlanArgs& a, Planned* p) {
  if (!a.store.empty()) return ptc::InvalidArgumentError("give either STORE or --from, not both");
  if (a.schema.empty() || a.dims.empty()) return ptc::InvalidArgumentError("--from needs --schema and --dims");
  PTC_ASSIGN_OR_RETURN(const ptc::ParallelConfig from, ptc::ParseConfig(a.from), "--from");
  PTC_ASSIGN_OR_RETURN(p->spec.schema, ptc::LoadSchema(a.schema));
  PTC_ASSIGN_OR_RETURN(p->spec.dims, ptc::ParseDims(a.dims));
  PTC_ASSIGN_OR_RETURN(p->spec.dtype, ptc::ParseDType(a.dtype));
  p->spec.optimizer = a.optimizer == "adam";
  const auto start = std::chrono::steady_clock::now();
  PTC_ASSIGN_OR_RETURN(const ptc::ModelLayout layout, ptc::ModelLayout::Make(p->spec, from), "--from");
  PTC_ASSIGN_OR_RETURN(ptc::GenerationManifest m, ptc::transform::LayoutManifest(layout));
  p->source = std::make_shared<const ptc::GenerationManifest>(std::move(m));
  p->source_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return ptc::Status::OK();
}

// `write`: a transform, which takes the writer lock before it reads the store.
ptc::Result<Planned> MakePlanned(const PlanArgs& a, bool write = false) {
  Planned p;
  PTC_ASSIGN_OR_RETURN(p.to, ptc::ParseConfig(a.to), "--to");
  PTC_ASSIGN_OR_RETURN(auto alive, ParseAlive(a.alive));
  if (a.from.empty() && (!a.schema.empty() || !a.dims.empty())) {
    return ptc::InvalidArgumentError("--schema and --dims describe the source of --from; give --from too");
  }
  if (!a.from.empty()) {
    PTC_RETURN_IF_ERROR(SourceFromDims(a, &p));
  } else if (a.store.empty()) {
    return ptc::InvalidArgumentError("give STORE, or --from with --schema and --dims to plan without one");
  } else if (write) {
    PTC_ASSIGN_OR_RETURN(ptc::StoreLock lock, LockStore(a.store, a.wait));
    PTC_ASSIGN_OR_RETURN(p.store, ptc::Store::OpenLocked(ptc::Env::Default(), a.store, std::move(lock)));
  } else {
    PTC_ASSIGN_OR_RETURN(p.store, ptc::Store::Open(ptc::Env::Default(), a.store));
  }
  if (p.store != nullptr) {
    if (!p.store->has_generation()) {
      return ptc::FailedPreconditionError(a.store + ": the store holds no generation yet");
    }
    p.source = p.store->CurrentSnapshot();
    PTC_ASSIGN_OR_RETURN(p.spec, ptc::SpecFromManifest(*p.source), a.store);
  }
  const auto start = std::chrono::steady_clock::now();
  PTC_ASSIGN_OR_RETURN(p.plan, ptc::transform::MakePlan({p.source.get(), p.spec, p.to, {a.workers_per_host}, alive}));
  p.covering = ptc::transform::MakeCovering(p.plan, *p.source, ptc::transform::CommitMode::kCovering);
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return p;
}

// The etcd values (cluster/job_state.h) of a change of a job whose
// generation is `m` to `to`, at their size: the change and the committed
// record, and each worker's part of a generation like `m` (its records), the
// largest before and after it is cut into values (CutPart).
nlohmann::json EtcdValueSizes(const ptc::GenerationManifest& m, const ptc::ParallelConfig& to) {
  namespace cluster = ptc::cluster;
  const std::string id(32, 'f');  // as long as a change id
  std::map<int, ptc::Part> parts;
  for (const ptc::ShardRecord& s : m.shards) parts[s.worker].shards.push_back(s);
  size_t largest_part = 0, largest_value = 0, chunks = 0;
  std::vector<int> workers;
  for (const auto& [w, part] : parts) {
    workers.push_back(w);
    std::string text = cluster::EncodePart(id, part, m.tensors);
    largest_part = std::max(largest_part, text.size());
    const cluster::PartValues values = cluster::CutPart(id, std::move(text));
    largest_value = std::max(largest_value, values.head.size());
    for (const std::string& c : values.chunks) largest_value = std::max(largest_value, c.size());
    chunks += values.chunks.size();
  }
  const size_t change = cluster::EncodeChange({id, m.generation, m.generation + 1, to.ToString(), workers}).size();
  const size_t committed =
      cluster::EncodeCommitted({m.generation, m.config, std::string(16, 'f'), std::string(16, 'f')}).size();
  return {{"change_bytes", change},          {"committed_bytes", committed}, {"parts", parts.size()},
          {"largest_part_bytes", largest_part}, {"part_chunks", chunks},
          {"largest_value_bytes", std::max({largest_value, change, committed})}};
}

ptc::Status RunPlan(const PlanArgs& a) {
  PTC_ASSIGN_OR_RETURN(Planned p, MakePlanned(a));
  const ptc::transform::Plan& plan = p.plan;
  const ptc::ParallelConfig& to = p.to;
  const double secs = p.seconds;
  const auto& source = p.source;
  const ptc::transform::Covering& c = p.covering;
  nlohmann::json j = PlanJson(plan, c, source->config, to.ToString());
  if (!a.from.empty()) {
    j["source"] = {{"from_dims", true}, {"tensors", source->tensors.size()}, {"shards", source->shards.size()}};
    if (a.manifest_size) {
      j["source"]["manifest_bytes"] = ptc::EncodeManifest(*source).size();
      PTC_ASSIGN_OR_RETURN(const ptc::dcp::Plan dcp, ptc::dcp::PlanCheckpoint(*source), "the DCP plan");
      j["source"]["dcp_metadata_bytes"] = ptc::dcp::EncodeMetadata(dcp).size();
      j["source"]["etcd"] = EtcdValueSizes(*source, to);
    }
  }
  if (a.json) {
    std::printf("%s\n", ptc::JsonText(j, 2).c_str());
  } else {
    if (!a.from.empty()) {
      std::printf("source %s of %s, no store: %zu tensors, %zu stored shards (built in %.3f s)\n",
                  source->config.c_str(), source->dims.c_str(), source->tensors.size(), source->shards.size(),
                  p.source_seconds);
      if (a.manifest_size) {
        const nlohmann::json& etcd = j["source"]["etcd"];
        std::printf("  manifest       %s (its generation manifest, encoded)\n",
                    HumanBytes(j["source"]["manifest_bytes"].get<uint64_t>()).c_str());
        std::printf("  DCP .metadata  %s (dcp/ of that generation)\n",
                    HumanBytes(j["source"]["dcp_metadata_bytes"].get<uint64_t>()).c_str());
        std::printf("  etcd values    largest %s; a worker's part up to %s, %zu chunks for %zu workers\n",
                    HumanBytes(etcd["largest_value_bytes"].get<uint64_t>()).c_str(),
                    HumanBytes(etcd["largest_part_bytes"].get<uint64_t>()).c_str(), etcd["part_chunks"].get<size_t>(),
                    etcd["parts"].get<size_t>());
      }
    }
    std::printf("plan %s -> %s (%.3f s)\n", source->config.c_str(), to.ToString().c_str(), secs);
    std::printf("  target shards  %zu (%zu kept as they are)\n", plan.targets.size(), j["kept_shards"].get<size_t>());
    std::printf("  bytes          %s total, %s kept, %s from pieces on-worker, %s moved between workers\n",
                HumanBytes(plan.bytes_total).c_str(), HumanBytes(plan.bytes_kept).c_str(),
                HumanBytes(plan.bytes_local).c_str(), HumanBytes(plan.bytes_moved).c_str());
    std::printf("  lower bound    %s (no replica on the receiving worker); bottleneck %s per worker\n",
                HumanBytes(plan.lower_bound).c_str(), HumanBytes(plan.bottleneck).c_str());
    std::printf("  transform      references %zu pieces (%s) and writes %s (parts from other workers)\n",
                c.references.size(), HumanBytes(c.bytes_referenced).c_str(), HumanBytes(c.bytes_written).c_str());
    std::printf("  compact        would then write %s (target shards not stored as they are)\n",
                HumanBytes(c.compact_bytes).c_str());
    for (const auto& m : j["missing"]) {
      std::printf("  MISSING        %s %s\n", m["tensor"].get<std::string>().c_str(),
                  m["box"].get<std::string>().c_str());
    }
  }
  if (!plan.missing.empty()) {
    return ptc::FailedPreconditionError(std::to_string(plan.missing.size()) + " regions have no live copy");
  }
  return ptc::Status::OK();
}

ptc::Status RunTransform(const PlanArgs& a) {
  PTC_ASSIGN_OR_RETURN(Planned p, MakePlanned(a, /*write=*/true));
  ptc::transform::ExecuteResult r;
  const auto start = std::chrono::steady_clock::now();
  {
    Progress progress("transform", p.covering.bytes_written);
    ptc::transform::ExecuteOptions options;
    options.threads = a.threads;
    options.progress = progress.fn();
    PTC_ASSIGN_OR_RETURN(r, ptc::transform::ExecutePlan(*p.store, p.source, p.spec, p.to, p.plan, options));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("generation %llu (%s) committed in %.2f s: %llu pieces referenced (%s), %llu written (%s)\n",
              static_cast<unsigned long long>(r.generation), p.to.ToString().c_str(), secs,
              static_cast<unsigned long long>(r.shards_referenced), HumanBytes(r.bytes_referenced).c_str(),
              static_cast<unsigned long long>(r.shards_written), HumanBytes(r.bytes_written).c_str());
  CollectAfterCommit("transform", *p.store, a.keep_old);
  return ptc::Status::OK();
}

void AddCommonOptions(CLI::App* sub, PlanArgs* a, bool store_required = true) {
  sub->add_option("--to", a->to, "target parallel config, e.g. tp=4,pp=1,dp=2,zero=1 (with experts: ep=, etp=; cp=)")
      ->required();
  sub->add_option("--alive", a->alive, "comma-separated workers whose shards can be read (default: all)");
  sub->add_option("--workers-per-host", a->workers_per_host, "topology: workers sharing a host (for link classes)")
      ->check(AtLeast(1));
  auto* store = sub->add_option("STORE", a->store, "store directory");
  if (store_required) store->required();
}

}  // namespace

void AddPlanCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* sub =
      app.add_subcommand("plan",
                         "Show what changing the store's current generation to --to would move, without moving\n"
                         "anything: bytes kept, copied on-worker and moved between workers, the lower bound (bytes\n"
                         "with no replica on their new worker), the per-worker bottleneck, and regions with no live\n"
                         "copy when --alive excludes workers (exit 1).");
  AddCommonOptions(sub, a.get(), /*store_required=*/false);
  sub->add_option("--from", a->from,
                  "plan without a store: the source is a store of --schema/--dims compacted in this config\n"
                  "(metadata only, no tensor data; e.g. a 671B MoE job's plan from its dims)");
  sub->add_option("--schema", a->schema, "with --from: built-in schema (megatron-gpt, llama) or schema JSON file");
  sub->add_option("--dims", a->dims, "with --from: model dims, e.g. layers=61,hidden=7168,...,experts=256");
  sub->add_option("--optimizer", a->optimizer, "with --from: optimizer state in the source")
      ->check(CLI::IsMember({"none", "adam"}));
  sub->add_option("--dtype", a->dtype, "with --from: parameter dtype (optimizer state is always f32)")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "f64"}));
  sub->add_flag("--manifest-size", a->manifest_size,
                "with --from: also encode the source manifest and the etcd values of a change (each worker's\n"
                "part, cut into values of at most 1 MiB) and print their sizes");
  sub->add_flag("--json", a->json, "machine-readable plan summary (docs/cli.md)");
  sub->callback([a, exit_code] { *exit_code = Report("plan", RunPlan(*a)); });
}

void AddTransformCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* sub =
      app.add_subcommand("transform",
                         "Rewrite the store for --to as a new generation: shards that do not change are referenced\n"
                         "(a pp-only or dp-only change writes no tensor bytes), the rest is streamed from the source\n"
                         "shards in bounded chunks on --threads threads. On failure the previous generation stays\n"
                         "current. Older generations are removed after the commit unless --keep-old. One writer at a\n"
                         "time: while a mount or another command writes STORE this fails naming it (--wait waits).");
  AddCommonOptions(sub, a.get());
  sub->add_option("--threads", a->threads, "writer threads")->check(CLI::Range(1, 256));
  sub->add_flag("--keep-old", a->keep_old, "keep earlier generations' files");
  AddWaitFlag(sub, &a->wait);
  sub->callback([a, exit_code] { *exit_code = Report("transform", RunTransform(*a)); });
}

}  // namespace ptcfs
