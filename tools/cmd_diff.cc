// ptcfs diff: do two per-rank checkpoints hold the same global tensors?
#include <cstdio>
#include <memory>

#include "ptc/checkpoint/diff.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace ptcfs {
namespace {

struct DiffArgs {
  std::string schema, dims, config_a, config_b, dir_a, dir_b;
};

int RunDiff(const DiffArgs& a) {
  auto run = [&]() -> ptc::Result<ptc::DiffResult> {
    PTC_ASSIGN_OR_RETURN(ptc::Schema schema, ptc::LoadSchema(a.schema));
    PTC_ASSIGN_OR_RETURN(ptc::ModelDims dims, ptc::ParseDims(a.dims));
    PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig ca, ptc::ParseConfig(a.config_a), "--config-a");
    PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig cb, ptc::ParseConfig(a.config_b), "--config-b");
    Progress progress("diff", 0);
    return ptc::DiffCheckpoints(ptc::Env::Default(), schema, dims, {a.dir_a, ca}, {a.dir_b, cb}, progress.fn());
  };
  auto result = run();
  if (!result.ok()) return Report("diff", result.status()) == 1 ? 1 : 2;
  if (result->equal) {
    std::printf("equal: %s and %s hold bit-identical global tensors\n", a.dir_a.c_str(), a.dir_b.c_str());
    return 0;
  }
  std::printf("different: %s\n", result->reason.c_str());
  return 1;
}

}  // namespace

void AddDiffCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<DiffArgs>();
  CLI::App* sub =
      app.add_subcommand("diff",
                         "Compare two per-rank checkpoints, possibly of different parallel configs, as global\n"
                         "tensors. Exit 0 only when every global tensor is bit-identical and all replicas inside\n"
                         "each checkpoint agree; otherwise exit 1 naming the first differing tensor and element.");
  sub->add_option("--schema", a->schema, "built-in schema or schema JSON file")->required();
  sub->add_option("--dims", a->dims, "model dims")->required();
  sub->add_option("--config-a", a->config_a, "parallel config of DIR_A")->required();
  sub->add_option("--config-b", a->config_b, "parallel config of DIR_B")->required();
  sub->add_option("DIR_A", a->dir_a, "first checkpoint")->required();
  sub->add_option("DIR_B", a->dir_b, "second checkpoint")->required();
  sub->callback([a, exit_code] { *exit_code = RunDiff(*a); });
}

}  // namespace ptcfs
