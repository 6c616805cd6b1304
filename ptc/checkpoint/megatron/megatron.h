// Megatron-LM checkpoints as trees of torch.save files (docs/megatron_format.md):
//
//   latest_checkpointed_iteration.txt               ASCII iteration, no newline
//   iter_0000100/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt   (_PPP when pp > 1, _EEE when ep > 1)
//
// This file is the pure part: names, where each local tensor sits in the
// pickled state dict, and the state dict of one rank. Rendering the bytes is
// view/megatron_file.h; reading files is ptc/format/torch_file.h.
//
// A rank's state dict:
//   {'args': Namespace (kept from the imported checkpoint, parallel sizes rewritten),
//    'checkpoint_version': 3 (an int: see megatron.cc), 'iteration': N,
//    'model': megatron-gpt: {'language_model': {'embedding': {'word_embeddings': {'weight'},
//                            'position_embeddings': {'weight'}}, 'encoder': {'layers.0....': ...}},
//                            'word_embeddings_for_head': {'weight'}}   (last stage, pp > 1)
//             other schemas: the local names as flat keys (Megatron-Core), with the
//             kept `*._extra_state` entries of the rank's modules (megatron/extra.h),
//    'optimizer': zero=0: Megatron's Float16OptimizerWithFloat16Params over torch Adam
//                 (ptc/checkpoint/megatron/optimizer.h): {'optimizer': {'state': {i: {'step',
//                 'exp_avg', 'exp_avg_sq'}}, 'param_groups': [{settings..., 'params': [...]}] x 2},
//                 'fp32_from_fp16_params': [[masters of group 0], [masters of group 1]]}
//                 (group 0: the parameters with weight decay, group 1: 1-D ones and biases);
//                 none with zero=1 (Megatron's distributed optimizer keeps it in
//                 distrib_optim.pt, which ptcfs does not render),
//    ...every other entry of the imported checkpoint (rng_state, opt_param_scheduler, ...)}
//
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/base/status.h"
#include "ptc/checkpoint/megatron/names.h"
#include "ptc/format/pickle.h"
#include "ptc/model/config.h"
#include "ptc/model/view.h"

namespace ptc::megatron {

inline constexpr std::string_view kLatestFile = "latest_checkpointed_iteration.txt";
inline constexpr std::string_view kRankFile = "model_optim_rng.pt";

std::string IterationDirName(uint64_t iteration);  // "iter_0000100"

// Megatron-LM's get_checkpoint_name: "mp_rank_01" when pp == 1, else
// "mp_rank_01_002"; with ep > 1 the expert-parallel rank appended, "_003".
std::string RankDirName(int tp_rank, int pp_rank, int pp, int ep_rank = 0, int ep = 1);
// The numbers of a rank directory's name, as written: with two numbers
// (mp_rank_TT_NNN) NNN is in pp_rank, and is the ep rank of a save with
// pp == 1 and ep > 1 (the save's args tell: ResolveRankDir).
struct RankDir {
  int tp_rank = 0;
  int pp_rank = -1;  // -1: the name has no second number
  int ep_rank = -1;  // -1: the name has no third number
};
// \error InvalidArgument naming the text.
Result<RankDir> ParseRankDirName(std::string_view name);
// `d` in a save whose names carry the pp rank (`with_pp`) and the ep rank
// (`with_ep`): {tp, pp (0 without), ep (0 without)}; nullopt when the name has
// another count of numbers.
std::optional<std::array<int, 3>> ResolveRankDir(const RankDir& d, bool with_pp, bool with_ep);

// Whether Megatron-LM's legacy (torch) save can hold `config`: the ranks
// that save are each (tp, pp, ep)'s expert-data-parallel rank 0, one file
// mp_rank_TT[_PPP][_EEE] each, which must hold every tp rank's dense shard
// and every (ep, etp) rank's expert shard of each stage. With etp = tp (the
// default) they do; with etp != tp they may not (tp=2,etp=1,ep=1 saves tp
// rank 1's dense shard nowhere), or two such ranks share a file name.
// \error FailedPrecondition naming the config and the rank or file at fault.
Status CheckLegacySave(const ParallelConfig& config);

// The rank of `config` that saves (and loads) the legacy file of (tp, pp,
// ep): the expert-data-parallel rank 0 of those coordinates; nullopt when
// none has them.
std::optional<int> LegacySaveRank(const ParallelConfig& config, int tp, int pp, int ep);

// The keys from the state dict's root to a model tensor: {"model", ...}.
std::vector<std::string> ModelKeyPath(std::string_view schema_name, std::string_view local_name);

// What a store keeps of a Megatron checkpoint besides the tensors of the
// schema, in the manifest's extra["megatron"] (carried over by transforms like
// every extra): the iteration, the other entries of the first rank's state
// dict (args, ...) and the bytes of the tensors among them, which reference
// storages "c0", "c1", ...; and each rank's rng_state (RankRng).
struct CarriedTensor {
  std::string key;  // "c0", ...
  DType dtype = DType::kU8;
  uint64_t numel = 0;
  std::string bytes;
};
// Points `t` (whose bytes are kept as a CarriedTensor `key`) at the start of
// that storage of its own, dense.
void PointAtOwnStorage(const std::string& key, pickle::Tensor& t);
// The 'rng_state' entry of one (tp, pp, ep) rank file of a save, kept per
// rank (each rank's random streams are its own; megatron-core seeds the
// expert-parallel tracker per ep rank). Its tensors reference storages "r0",
// "r1", ... (the same keys in every rank's record).
struct RankRng {
  int tp = 0, pp = 0;
  int ep = 0;  // the expert-parallel rank of the file (mp_rank_..._EEE); 0 without
  pickle::Value value;
  std::vector<CarriedTensor> tensors{};
};
// The `step` of the Adam state of some parameters (the same value for each):
// a tensor whose storage is `tensor` (torch >= 1.12: a float32 scalar), or a
// number (older torch).
struct StepValue {
  std::vector<std::string> params{};  // global parameter names
  pickle::Value value;
  std::vector<CarriedTensor> tensors{};  // the tensor's bytes, key "s"; empty for a number
};
// What an optimizer state dict holds besides its tensors
// (ptc/checkpoint/megatron/optimizer.h): each parameter group's settings
// (lr, betas, eps, weight_decay, wd_mult, ...: a dict without 'params'), in
// Megatron's group order, and each parameter's `step`. Settings are kept for
// one or two groups, or none (then rendered with defaults).
struct OptimizerMeta {
  pickle::Value groups = pickle::Value::List();
  std::vector<StepValue> steps{};
  // The expert-parallel optimizer's groups (Megatron-Core's ChainedOptimizer's
  // second, a model with experts at ep > 1): two entries by Megatron's group
  // (0 with weight decay, 1 without), each a settings dict or None (no such
  // group, or not kept); an empty list: none kept (they render as the dense
  // group of the same weight decay, is_expert_parallel True).
  pickle::Value expert_groups = pickle::Value::List();
};
// One `*._extra_state` entry of a saved rank's model dict
// (ptc/checkpoint/megatron/extra.h): its global key, the global name of the
// schema tensor it sits by, its value; its tensors reference storages
// "x<entry>_<n>" (unique in the state).
struct ExtraEntry {
  int tp = 0;  // the saved tp rank
  std::string key, anchor;
  pickle::Value value;
  std::vector<CarriedTensor> tensors{};
};
struct MegatronState {
  uint64_t iteration = 0;
  pickle::Value carried;  // a dict, or None for stores not imported from Megatron
  std::vector<CarriedTensor> tensors{};
  // Per-rank rng states of the save's tp x pp x ep grid (rng_tp * rng_pp *
  // rng_ep records, any order), or none: then `carried` holds the first
  // rank's (older stores, saves without rng_state).
  int rng_tp = 0, rng_pp = 0, rng_ep = 1;
  std::vector<RankRng> rng{};
  OptimizerMeta optimizer{};
  // The model dicts' `*._extra_state` entries of a save at tensor parallelism
  // extra_tp (0: none kept).
  int extra_tp = 0;
  std::vector<ExtraEntry> extra{};
};

// The record whose rng_state rank (tp, pp, ep) gets: the one of the same
// coordinates when the saved grid has them, else (tp mod rng_tp, pp mod
// rng_pp, ep mod rng_ep) (docs/megatron_format.md). nullptr when no per-rank
// state is kept.
const RankRng* RngFor(const MegatronState& state, int tp, int pp, int ep = 0);
inline constexpr std::string_view kManifestKey = "megatron";
// Largest tensor kept among the carried entries (they live in the manifest).
inline constexpr uint64_t kMaxCarriedTensorBytes = 1 << 20;

// The state in `extra` (iteration 0, nothing carried, when absent).
// \error InvalidArgument naming `what` when extra["megatron"] is malformed.
Result<MegatronState> LoadMegatronState(const nlohmann::json& extra, const std::string& what);
nlohmann::json EncodeMegatronState(const MegatronState& state);

// The state dict of `view`'s rank in name set `names` (megatron/names.h: the
// model dict's names and order, and so the optimizer state's numbering):
// tensors are references to storages "0", "1", ... holding the rank's local
// tensors (model tensors, then optimizer state), then the carried tensors'
// storages. The carried entries' `args`
// get tensor_model_parallel_size, pipeline_model_parallel_size,
// data_parallel_size, context_parallel_size, expert_model_parallel_size,
// expert_tensor_parallel_size and world_size of `config` (those present); 'rng_state'
// is the rank's own when kept per rank (RngFor), its tensors' storages last.
struct RankState {
  struct Storage {
    std::string key;
    const LocalTensor* tensor = nullptr;     // a local tensor of the view, or
    const CarriedTensor* carried = nullptr;  // one of the state's carried tensors or of `own`
  };
  pickle::Value root;
  // The view in the rendered names and order; the storages' tensors are its.
  std::shared_ptr<const RankView> view;
  std::vector<Storage> storages;
  std::vector<CarriedTensor> own{};  // the default step, when one is rendered (never resized after)
};
// The model dict gets the kept `*._extra_state` entries of the rank's modules
// (PlaceExtras), their tensors' storages after the carried ones.
// \error InvalidArgument when state.carried is neither a dict nor None.
Result<RankState> BuildRankState(const ModelSpec& spec, const ParallelConfig& config, const RankView& view,
                                 const MegatronState& state, NameSet names = NameSet::kTe);

// The name set of a rank file's model dict (RecogniseNameSet): `view` in the
// schema's names. `what` names the file.
// \error as RecogniseNameSet.
Result<NameSet> FileNameSet(const ModelSpec& spec, const RankView& view, const pickle::Value& root,
                            const std::string& what);

// The tensors of `view` (the schema's names) found in a rank file's state
// dict, in the order of view.model then view.optim. The file may use either
// name set (FileNameSet); with optimizer state, its model dict must hold the
// parameters in that set's registration order, which numbers the state
// (docs/megatron_format.md, "The parameter order"). `what` names the file.
// \error InvalidArgument naming the file and the key path: a tensor missing,
//        an entry that is not a tensor, another dtype or shape than the view's,
//        a view that is not contiguous; names of both sets; with optimizer
//        state, the first parameter out of order; optimizer state in a layout
//        not above; a view with ZeRO-1 optimizer state.
Result<std::vector<pickle::Tensor>> FindRankTensors(const ModelSpec& spec, const ParallelConfig& config,
                                                    const RankView& view, const pickle::Value& root,
                                                    const std::string& what);

// The root without 'model' and the optimizer's state ('optimizer' keeps
// Megatron's other optimizer entries, such as 'grad_scaler'): what import
// keeps (its tensors still reference the imported file's storages).
pickle::Value CarriedEntries(const pickle::Value& root);

// An int attribute of the state dict's 'args' (an argparse Namespace):
// nullopt when the root has no args object or args lacks the attribute.
// \error InvalidArgument naming `what` and args.<name> when it is not an int.
Result<std::optional<int64_t>> ArgsInt(const pickle::Value& root, std::string_view name, const std::string& what);

}  // namespace ptc::megatron
