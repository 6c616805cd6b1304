// ptcfs synth: a synthetic per-rank checkpoint, the reference for tests.
#include <memory>

#include "ptc/checkpoint/synth_checkpoint.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace ptcfs {
namespace {

struct SynthArgs {
  std::string schema, dims, config, optimizer = "none", dtype = "f32", out;
  uint64_t seed = 0;
};

ptc::Status RunSynth(const SynthArgs& a) {
  ptc::ModelSpec spec;
  PTC_ASSIGN_OR_RETURN(spec.schema, ptc::LoadSchema(a.schema));
  PTC_ASSIGN_OR_RETURN(spec.dims, ptc::ParseDims(a.dims));
  PTC_ASSIGN_OR_RETURN(spec.dtype, ptc::ParseDType(a.dtype));
  spec.optimizer = a.optimizer == "adam";
  PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig config, ptc::ParseConfig(a.config));
  PTC_ASSIGN_OR_RETURN(const ptc::ModelLayout layout, ptc::ModelLayout::Make(std::move(spec), config));
  ptc::Env* env = ptc::Env::Default();
  if (env->Exists(a.out)) {
    PTC_ASSIGN_OR_RETURN(auto names, env->ListDir(a.out));
    if (!names.empty()) return ptc::InvalidArgumentError(a.out + ": exists and is not empty");
  }
  PTC_ASSIGN_OR_RETURN(uint64_t total, ptc::CheckpointBytes(layout));
  Progress progress("synth", total);
  return ptc::WriteSynthCheckpoint(env, layout, a.seed, a.out, progress.fn());
}

}  // namespace

void AddSynthCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<SynthArgs>();
  CLI::App* sub =
      app.add_subcommand("synth",
                         "Write a per-rank safetensors checkpoint of synthetic values. Each global tensor is a\n"
                         "deterministic function of (tensor name, seed) only, so synth of one model under two\n"
                         "configs describes the same global tensors: the reference for import/export checks.");
  sub->add_option("--schema", a->schema, "built-in schema (megatron-gpt, llama) or schema JSON file")->required();
  sub->add_option("--dims", a->dims,
                  "model dims, e.g. layers=4,hidden=64,heads=4,vocab=1024,seq=128[,ffn=,kv_heads=,head_dim=]\n"
                  "[,experts=,moe_ffn=,shared_ffn=,moe_every=,dense_first=] (mixture of experts)\n"
                  "[,kv_lora=,q_lora=,qk_nope=,qk_rope=,v_head=] (multi-head latent attention)")
      ->required();
  sub->add_option("--config", a->config, "parallel config, e.g. tp=2,pp=2,dp=1[,cp=,ep=,etp=][,zero=1][,pp_layers=1+3][,per_worker=8]")
      ->required();
  sub->add_option("--optimizer", a->optimizer, "optimizer state to include")->check(CLI::IsMember({"none", "adam"}));
  sub->add_option("--dtype", a->dtype, "parameter dtype (optimizer state is always f32)")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "f64"}));
  sub->add_option("--seed", a->seed, "seed of the synthetic values");
  sub->add_option("OUT_DIR", a->out, "directory to create: OUT_DIR/rank-RRRRR/{model,optim}.safetensors")->required();
  sub->callback([a, exit_code] { *exit_code = Report("synth", RunSynth(*a)); });
}

}  // namespace ptcfs
