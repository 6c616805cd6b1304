#include "ptc/checkpoint/megatron/import.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <tuple>

#include "ptc/checkpoint/megatron/extra.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/megatron/optimizer.h"
#include "ptc/format/torch_file.h"

namespace ptc {
namespace {

struct Tree {
  std::string iter_dir;
  uint64_t iteration = 0;
  int tp = 0, pp = 0, ep = 1;
  bool with_pp = false;                                         // directories named mp_rank_TT_PPP[_EEE]
  bool with_ep = false;                                         // directories named mp_rank_TT[_PPP]_EEE
  std::vector<std::pair<std::string, megatron::RankDir>> dirs;  // the rank directories there, as named
  std::set<std::tuple<int, int, int>> present;                  // their (tp, pp, ep) (Resolve)
};

std::string DirName(const Tree& t, int tp, int pp, int ep) {
  return megatron::RankDirName(tp, pp, t.with_pp ? 2 : 1, ep, t.with_ep ? 2 : 1);
}

// The rank file of (tp, pp, ep) as the directories name it.
std::string RankFile(const Tree& t, int tp, int pp, int ep) {
  return JoinPath(JoinPath(t.iter_dir, DirName(t, tp, pp, ep)), std::string(megatron::kRankFile));
}

// t->present from the directories' names read with t->with_pp and t->with_ep.
// \error InvalidArgument naming a directory with another count of numbers.
Status Resolve(Tree* t) {
  t->present.clear();
  for (const auto& [name, d] : t->dirs) {
    const auto at = megatron::ResolveRankDir(d, t->with_pp, t->with_ep);
    if (!at) {
      return InvalidArgumentError(JoinPath(t->iter_dir, name) + ": not named as the save's other rank directories (" +
                                  std::string(t->with_pp ? "with" : "without") + " a pp rank, " +
                                  std::string(t->with_ep ? "with" : "without") + " an ep rank)");
    }
    t->present.insert({(*at)[0], (*at)[1], (*at)[2]});
  }
  return Status::OK();
}

Result<uint64_t> LatestIteration(Env* env, const std::string& dir) {
  const std::string path = JoinPath(dir, std::string(megatron::kLatestFile));
  if (!env->Exists(path)) return NotFoundError(path + ": missing (name the iteration with --iteration)");
  PTC_ASSIGN_OR_RETURN(auto file, env->OpenRead(path));
  std::string text(std::min<uint64_t>(file->Size(), 64), '\0');
  PTC_RETURN_IF_ERROR(file->Read(0, text.size(), text.data()));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  uint64_t it = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), it);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return InvalidArgumentError(path + ": '" + text + "' is not an iteration number");
  }
  return it;
}

// The iteration's directory and the rank directories in it (the grid is set
// later: from the save's args when they give it, else from these).
Result<Tree> ScanTree(Env* env, const MegatronImportOptions& o) {
  Tree t;
  if (o.iteration) {
    t.iteration = *o.iteration;
  } else {
    PTC_ASSIGN_OR_RETURN(t.iteration, LatestIteration(env, o.dir));
  }
  t.iter_dir = JoinPath(o.dir, megatron::IterationDirName(t.iteration));
  if (!env->IsDirectory(t.iter_dir)) return NotFoundError(t.iter_dir + ": missing (no checkpoint of that iteration)");
  PTC_ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(t.iter_dir));
  std::set<int> numbers;  // in the names
  for (const std::string& name : names) {
    if (!name.starts_with("mp_rank_")) continue;
    PTC_ASSIGN_OR_RETURN(megatron::RankDir d, megatron::ParseRankDirName(name), t.iter_dir);
    t.dirs.emplace_back(name, d);
    numbers.insert(1 + (d.pp_rank >= 0) + (d.ep_rank >= 0));
  }
  if (t.dirs.empty()) return NotFoundError(t.iter_dir + ": no mp_rank_* directory");
  if (numbers.size() > 1) {
    return InvalidArgumentError(t.iter_dir + ": rank directories of " + std::to_string(*numbers.begin()) + " and " +
                                std::to_string(*numbers.rbegin()) + " numbers mixed (mp_rank_TT[_PPP][_EEE])");
  }
  // Until the args say otherwise, two numbers are tp and pp (an ep rank comes third, or second when pp == 1).
  t.with_pp = *numbers.begin() >= 2;
  t.with_ep = *numbers.begin() == 3;
  PTC_RETURN_IF_ERROR(Resolve(&t));
  for (const auto& [tp, pp, ep] : t.present) {
    t.tp = std::max(t.tp, tp + 1);
    t.pp = std::max(t.pp, pp + 1);
    t.ep = std::max(t.ep, ep + 1);
  }
  return t;
}

// Every rank directory of the tp x pp grid is there, and no other; `why`
// says where the grid comes from.
Status CheckGrid(const Tree& t, const std::string& why) {
  for (int pp = 0; pp < t.pp; ++pp) {
    for (int ep = 0; ep < t.ep; ++ep) {
      for (int tp = 0; tp < t.tp; ++tp) {
        if (t.present.count({tp, pp, ep}) == 0) {
          return NotFoundError(JoinPath(t.iter_dir, DirName(t, tp, pp, ep)) + ": missing (" + why + ")");
        }
      }
    }
  }
  for (const auto& [tp, pp, ep] : t.present) {
    if (tp >= t.tp || pp >= t.pp || ep >= t.ep) {
      return InvalidArgumentError(JoinPath(t.iter_dir, DirName(t, tp, pp, ep)) + ": outside the save's grid (" + why +
                                  ")");
    }
  }
  return Status::OK();
}

std::string GridText(int tp, int pp, int ep = 1) {
  return "tp=" + std::to_string(tp) + ", pp=" + std::to_string(pp) + (ep > 1 ? ", ep=" + std::to_string(ep) : "");
}

// The save's grid is tp x pp x ep: the directories' names read so. Megatron
// names mp_rank_TT_PPP when pp > 1 and appends _EEE when ep > 1; names of
// two numbers hold the ep rank second when pp == 1 < ep.
// \error as Resolve.
Status ApplyGrid(int tp, int pp, int ep, Tree* t) {
  t->tp = tp;
  t->pp = pp;
  t->ep = ep;
  const bool ep_second = !t->with_ep && t->with_pp && pp == 1 && ep > 1;
  t->with_ep = t->with_ep || ep_second || ep > 1;
  t->with_pp = (t->with_pp && !ep_second) || pp > 1;
  return Resolve(t);
}

// The grid: tensor_model_parallel_size, pipeline_model_parallel_size and
// expert_model_parallel_size of the first rank's args when it has them (a
// partial save then names the missing rank), else `config`'s when given (a
// tree without args, mp_rank_TT_EEE read as ep ranks when its pp is 1 < ep),
// else the directories present.
Status SetGrid(const pickle::Value& first_root, const std::string& first, const std::optional<ParallelConfig>& config,
               Tree* t) {
  PTC_ASSIGN_OR_RETURN(std::optional<int64_t> tp, megatron::ArgsInt(first_root, "tensor_model_parallel_size", first));
  PTC_ASSIGN_OR_RETURN(std::optional<int64_t> pp, megatron::ArgsInt(first_root, "pipeline_model_parallel_size", first));
  PTC_ASSIGN_OR_RETURN(std::optional<int64_t> ep, megatron::ArgsInt(first_root, "expert_model_parallel_size", first));
  if ((!tp || !pp) && config) {  // no args: the given config's grid (the directories' names read by it)
    PTC_RETURN_IF_ERROR(ApplyGrid(config->tp, config->pp, config->ep, t));
    return CheckGrid(*t, "--config " + config->ToString() + " says " + GridText(t->tp, t->pp, t->ep));
  }
  if (!tp || !pp) return CheckGrid(*t, "the other directories make " + GridText(t->tp, t->pp, t->ep));
  const int64_t e = ep.value_or(1);
  if (*tp < 1 || *pp < 1 || e < 1 || *tp > 1 << 16 || *pp > 1 << 16 || e > 1 << 16) {
    return InvalidArgumentError(first + ": args give " +
                                GridText(static_cast<int>(*tp), static_cast<int>(*pp), static_cast<int>(e)));
  }
  PTC_RETURN_IF_ERROR(ApplyGrid(static_cast<int>(*tp), static_cast<int>(*pp), static_cast<int>(e), t));
  return CheckGrid(*t, "the args of " + first + " say " + GridText(t->tp, t->pp, t->ep));
}

// A mixture-of-experts tree whose directories have two numbers
// (mp_rank_TT_NNN) and whose first file has no args to say whether NNN is
// the pp rank or the ep rank (pp = 1 < ep), imported without --config: refused
// rather than guessed.
// \error InvalidArgument naming the directory and the way out.
Status RefuseAmbiguousNames(const pickle::Value& first_root, const std::string& first,
                            const MegatronImportOptions& o, const Tree& t) {
  if (o.config || o.dims.experts == 0 || !t.with_pp || t.with_ep) return Status::OK();
  PTC_ASSIGN_OR_RETURN(std::optional<int64_t> tp, megatron::ArgsInt(first_root, "tensor_model_parallel_size", first));
  if (tp) return Status::OK();
  return InvalidArgumentError(JoinPath(t.iter_dir, t.dirs.front().first) +
                              ": its second number is the pp rank, or the ep rank of a save with pp=1 < ep, and " +
                              first + " has no args to tell (a mixture-of-experts model): give the save's --config");
}

// The config a legacy save of grid tp x pp x ep is read in: each ep rank one
// data-parallel rank (the expert-data-parallel rank 0 of its (tp, pp, ep)).
ParallelConfig SaveGrid(int tp, int pp, int ep) {
  ParallelConfig c;
  c.tp = tp;
  c.pp = pp;
  c.dp = ep;
  c.ep = ep;
  return c;
}

// True when `root` holds optimizer state in the layout ptcfs renders.
bool HasOptimizer(const pickle::Value& root) {
  const pickle::Value* o = root.Find("optimizer");
  if (o != nullptr && o->is_sequence() && !o->items().empty()) o = &o->items()[0];  // ChainedOptimizer's
  return o != nullptr && o->Find("optimizer") != nullptr && o->Find("fp32_from_fp16_params") != nullptr;
}

// Copies the bytes of every tensor under `value` out of the file into `out`
// (keys prefix + index) and points the tensors at them.
Status KeepTensors(const RandomAccessFile& file, const TorchFile& tf, const std::string& prefix,
                   const std::string& what, pickle::Value* value, std::vector<megatron::CarriedTensor>* out) {
  Status error;
  pickle::ForEachTensor(*value, [&](const std::string& path, pickle::Tensor& t) {
    if (!error.ok()) return;
    if (TensorNumBytes(t) > megatron::kMaxCarriedTensorBytes) {
      error = InvalidArgumentError(what + ": " + path + ": a tensor of " + std::to_string(TensorNumBytes(t)) +
                                   " bytes outside the schema (at most " +
                                   std::to_string(megatron::kMaxCarriedTensorBytes) + " are kept)");
      return;
    }
    auto bytes = ReadTensorBytes(file, tf, t, what);
    if (!bytes.ok()) {
      error = bytes.status();
      return;
    }
    megatron::CarriedTensor c{prefix + std::to_string(out->size()), t.dtype, TensorNumElements(t),
                              std::move(bytes).value()};
    megatron::PointAtOwnStorage(c.key, t);
    out->push_back(std::move(c));
  });
  return error;
}

// One rank's 'rng_state' with its tensors' bytes.
Result<megatron::RankRng> KeepRng(const RandomAccessFile& file, const TorchFile& tf, int tp, int pp, int ep,
                                  const std::string& what) {
  const pickle::Value* rng = tf.root.Find("rng_state");
  if (rng == nullptr) return InvalidArgumentError(what + ": rng_state: missing (the first rank's file has one)");
  megatron::RankRng out{tp, pp, ep, *rng, {}};
  PTC_RETURN_IF_ERROR(KeepTensors(file, tf, "r", what + ": rng_state", &out.value, &out.tensors));
  return out;
}

// Refuses an `*._extra_state` entry inside the nested dicts of legacy
// Megatron's model (what ptcfs keeps is Megatron-Core's, in its flat dict):
// such a save is not taken with the entry silently dropped.
Status RefuseNestedExtras(const pickle::Value& dict, const std::string& path) {
  for (const auto& [key, value] : dict.pairs()) {
    if (key.kind() != pickle::Kind::kStr) continue;
    const std::string here = path + "/" + key.as_str();
    if (value.is_dict()) {
      PTC_RETURN_IF_ERROR(RefuseNestedExtras(value, here));
    } else if (megatron::IsExtraStateKey(key.as_str())) {
      return InvalidArgumentError(here +
                                  ": extra state in legacy Megatron's nested model dict is not kept (ptcfs "
                                  "keeps Megatron-Core's, in its flat model dict); save without it");
    }
  }
  return Status::OK();
}

// The `*._extra_state` entries of one rank's flat model dict (Megatron-Core),
// named globally, with their tensors' bytes (storages "x<entry>_<n>" of this
// rank's entries; FoldRanks numbers them in the whole state).
// \error InvalidArgument for one in a nested (legacy) model dict.
Status KeepExtras(const RankView& view, const RandomAccessFile& file, const TorchFile& tf, const std::string& what,
                  std::vector<megatron::ExtraEntry>* out) {
  const pickle::Value* model = tf.root.Find("model");
  if (model == nullptr || !model->is_dict() || view.model.empty()) return Status::OK();
  for (const auto& [key, value] : model->pairs()) {
    if (key.kind() == pickle::Kind::kStr && value.is_dict()) {
      PTC_RETURN_IF_ERROR(RefuseNestedExtras(value, what + ": model/" + key.as_str()));
    }
    if (key.kind() != pickle::Kind::kStr || !megatron::IsExtraStateKey(key.as_str())) continue;
    megatron::ExtraName name = megatron::GlobalExtraName(view, key.as_str());
    megatron::ExtraEntry e{view.coords.tp, std::move(name.key), std::move(name.anchor), value, {}};
    const std::string prefix = "x" + std::to_string(out->size()) + "_";
    PTC_RETURN_IF_ERROR(KeepTensors(file, tf, prefix, what + ": model/" + key.as_str(), &e.value, &e.tensors));
    out->push_back(std::move(e));
  }
  return Status::OK();
}

// The `step` of every parameter of `view` in the rank file `tf`, one record
// per parameter in the view's order (FoldRanks keeps each once).
Status KeepSteps(const RankView& view, const megatron::OptimizerLayout& layout, const RandomAccessFile& file,
                 const TorchFile& tf, const std::string& what, std::vector<megatron::StepValue>* out) {
  const pickle::Value* optimizer = tf.root.Find("optimizer");
  std::vector<const pickle::Value*> states;  // of each optimizer (a ChainedOptimizer's two)
  for (size_t c = 0; c < (layout.chained ? 2 : 1); ++c) {
    const pickle::Value* one = layout.chained ? &optimizer->items()[c] : optimizer;
    const pickle::Value* inner = one->Find("optimizer");
    states.push_back(inner == nullptr ? nullptr : inner->Find("state"));
  }
  pickle::DictIndex index;  // state holds an entry per parameter
  for (size_t i = 0; i < view.model.size(); ++i) {
    if (!HasOptimizerState(view.model[i])) continue;  // a buffer: no slot
    const pickle::Value* state = states[layout.chained ? layout.slots[i].chain : 0];
    const pickle::Value* entry = state == nullptr ? nullptr : index.Find(*state, layout.slots[i].key);
    const pickle::Value* step = entry == nullptr ? nullptr : entry->Find("step");
    if (step == nullptr || view.model[i].segments.empty()) continue;
    const std::string chain = layout.chained ? std::to_string(layout.slots[i].chain) + "/" : "";
    const std::string where =
        what + ": optimizer/" + chain + "optimizer/state/" + layout.slots[i].key.DebugString() + "/step";
    megatron::StepValue value{{view.model[i].segments[0].tensor}, *step, {}};
    if (step->is_tensor()) {
      pickle::Tensor& t = value.value.tensor();
      if (TensorNumBytes(t) > 64) return InvalidArgumentError(where + ": a tensor of more than one number");
      PTC_ASSIGN_OR_RETURN(std::string bytes, ReadTensorBytes(file, tf, t, where));
      value.tensors.push_back({"s", t.dtype, TensorNumElements(t), std::move(bytes)});
      megatron::PointAtOwnStorage("s", t);
    } else if (step->kind() != pickle::Kind::kInt && step->kind() != pickle::Kind::kFloat) {
      return InvalidArgumentError(where + ": a " + std::string(pickle::KindName(step->kind())) +
                                  ", not a tensor or a number");
    }
    out->push_back(std::move(value));
  }
  return Status::OK();
}

// What one rank file (tp, pp) holds besides the schema's tensors (KeptRank).
// `first`: rank (0, 0), whose other entries (args, ...) and optimizer group
// settings are kept too. `optimizer`: the save holds optimizer state (the
// first file it was judged by says so).
Result<KeptRank> KeepRank(const RandomAccessFile& file, const TorchFile& tf, const ModelLayout& layout, int tp, int pp,
                          int ep, const std::string& path) {
  const ModelSpec& spec = layout.spec();
  const ParallelConfig& config = layout.config();
  KeptRank k{tp, pp, path, {}, ep};
  megatron::MegatronState& kept = k.kept;
  const bool first = tp == 0 && pp == 0 && ep == 0;
  if (first) {
    kept.carried = megatron::CarriedEntries(tf.root);
    kept.carried.Erase("rng_state");
    PTC_RETURN_IF_ERROR(KeepTensors(file, tf, "c", path, &kept.carried, &kept.tensors));
  }
  // Every file's rng_state (kept per (tp, pp, ep); docs/megatron_format.md).
  if (tf.root.Find("rng_state") != nullptr) {
    PTC_ASSIGN_OR_RETURN(kept.rng.emplace_back(), KeepRng(file, tf, tp, pp, ep, path));
  }
  const std::optional<int> rank = megatron::LegacySaveRank(config, tp, pp, ep);
  if (!rank) return InvalidArgumentError(path + ": no rank of config " + config.ToString() + " saves this file");
  PTC_ASSIGN_OR_RETURN(RankView view, layout.View(*rank));
  // The rank's tensors as the file names and numbers them (either of Megatron-Core's name sets).
  PTC_ASSIGN_OR_RETURN(const megatron::NameSet names, megatron::FileNameSet(spec, view, tf.root, path));
  PTC_RETURN_IF_ERROR(megatron::CheckNameSetSplits(names, config.tp, view), path);
  view = megatron::ViewInNameSet(view, names);
  PTC_RETURN_IF_ERROR(KeepExtras(view, file, tf, path, &kept.extra));
  if (!spec.optimizer || config.zero == 1) return k;
  const pickle::Value* optimizer = tf.root.Find("optimizer");
  if (optimizer == nullptr) return InvalidArgumentError(path + ": optimizer: missing (the first rank's file has one)");
  PTC_ASSIGN_OR_RETURN(megatron::OptimizerLayout groups, megatron::ReadOptimizerLayout(view, *optimizer, path));
  if (first) kept.optimizer.groups = megatron::GroupSettings(groups, *optimizer);
  // Every file's: a stage without MoE layers (dense_first) has none of its own (FoldRanks).
  kept.optimizer.expert_groups = megatron::ExpertGroupSettings(groups, *optimizer);
  PTC_RETURN_IF_ERROR(KeepSteps(view, groups, file, tf, path, &kept.optimizer.steps));
  return k;
}

// Renames the storages of an extra entry's tensors from "x<old>_<n>" to "x<entry>_<n>".
void NumberExtra(size_t entry, megatron::ExtraEntry* e) {
  auto renamed = [&](const std::string& key) { return "x" + std::to_string(entry) + key.substr(key.find('_')); };
  for (megatron::CarriedTensor& t : e->tensors) t.key = renamed(t.key);
  pickle::ForEachTensor(e->value,
                        [&](const std::string&, pickle::Tensor& t) { t.storage_key = renamed(t.storage_key); });
}

}  // namespace

Result<megatron::MegatronState> FoldRanks(uint64_t iteration, int tp, int pp, std::vector<KeptRank> ranks, int ep) {
  // ep rank 0's files first (their extra entries are kept first), each in (pp, tp) order.
  auto order = [](const KeptRank& r) { return std::tie(r.ep, r.pp, r.tp); };
  std::sort(ranks.begin(), ranks.end(), [&](const KeptRank& a, const KeptRank& b) { return order(a) < order(b); });
  for (size_t i = 0; i < ranks.size(); ++i) {
    const KeptRank& r = ranks[i];
    if (r.tp < 0 || r.pp < 0 || r.ep < 0 || r.tp >= tp || r.pp >= pp || r.ep >= ep ||
        (i > 0 && order(r) == order(ranks[i - 1]))) {
      return InvalidArgumentError(r.file + ": rank (" + std::to_string(r.tp) + ", " + std::to_string(r.pp) +
                                  (ep > 1 ? ", ep " + std::to_string(r.ep) : std::string()) +
                                  ") is outside the save's grid (" + GridText(tp, pp, ep) + ") or given twice");
    }
  }
  if (ranks.size() != static_cast<size_t>(tp) * pp * ep) {
    return InvalidArgumentError("the save's grid (" + GridText(tp, pp, ep) + ") has " + std::to_string(tp * pp * ep) +
                                " rank files, " + std::to_string(ranks.size()) + " were kept");
  }
  megatron::MegatronState state{iteration, std::move(ranks[0].kept.carried), std::move(ranks[0].kept.tensors)};
  state.optimizer.groups = std::move(ranks[0].kept.optimizer.groups);
  // Each expert-parallel group's settings from the first file whose experts are in it (the
  // first stage may have no MoE layer: its expert optimizer's groups hold no parameter).
  for (const KeptRank& r : ranks) {
    const pickle::Items& groups = r.kept.optimizer.expert_groups.items();
    if (groups.size() != 2) continue;
    if (state.optimizer.expert_groups.items().empty()) {
      state.optimizer.expert_groups = pickle::Value::List({pickle::Value::None(), pickle::Value::None()});
    }
    for (size_t g = 0; g < 2; ++g) {
      pickle::Value& into = state.optimizer.expert_groups.items()[g];
      if (into.is_none() && !groups[g].is_none()) into = groups[g];
    }
  }
  const bool per_rank_rng = !ranks[0].kept.rng.empty();
  if (per_rank_rng) {
    state.rng_tp = tp;
    state.rng_pp = pp;
    state.rng_ep = ep;
  }
  // An extra entry another pp or ep rank of the same tp rank kept under the
  // same global name and anchor already is not kept again (a grouped
  // linear's of each ep rank is: its anchor is that rank's first expert); a
  // parameter's step is kept once (the first of its shards, which the others
  // must equal).
  std::set<std::tuple<int, std::string, std::string>> extras_seen;
  std::map<std::string, size_t> step_of;
  auto same = [](const megatron::StepValue& a, const megatron::StepValue& b) {
    return a.value == b.value && (a.tensors.empty() || a.tensors[0].bytes == b.tensors[0].bytes);
  };
  for (KeptRank& r : ranks) {
    if (per_rank_rng) {
      if (r.kept.rng.empty()) {
        return InvalidArgumentError(r.file + ": rng_state: missing (the first rank's file has one)");
      }
      state.rng.push_back(std::move(r.kept.rng[0]));
    }
    for (megatron::ExtraEntry& e : r.kept.extra) {
      if (!extras_seen.insert({e.tp, e.key, e.anchor}).second) continue;
      NumberExtra(state.extra.size(), &e);
      state.extra.push_back(std::move(e));
    }
    for (megatron::StepValue& value : r.kept.optimizer.steps) {
      const std::string& name = value.params[0];
      if (const auto it = step_of.find(name); it != step_of.end()) {
        if (!same(state.optimizer.steps[it->second], value)) {
          return InvalidArgumentError(
              r.file + ": the optimizer step of " + name +
              " differs from its step in another rank's file (a parameter's shards share one step)");
        }
        continue;
      }
      size_t k = 0;
      while (k < state.optimizer.steps.size() && !same(state.optimizer.steps[k], value)) ++k;
      if (k == state.optimizer.steps.size()) {
        state.optimizer.steps.push_back(std::move(value));
      } else {
        state.optimizer.steps[k].params.push_back(name);
      }
      step_of[name] = k;
    }
  }
  if (!state.extra.empty()) state.extra_tp = tp;
  return state;
}

namespace {

// The spec of a save as its rank file `path` (rank (tp, pp) of `config`)
// shows it: optimizer state or not, and the dtype most of the rank's
// parameters have (one tensor of another dtype is then blamed by name,
// FindRankTensors, not every other tensor).
Result<ModelSpec> SaveSpec(const MegatronImportOptions& o, const ParallelConfig& config, int tp, int pp, int ep,
                           const TorchFile& tf, const std::string& path) {
  ModelSpec spec{o.schema, o.dims, DType::kF32, HasOptimizer(tf.root)};
  PTC_ASSIGN_OR_RETURN(const ModelLayout layout, ModelLayout::Make(spec, config));
  const std::optional<int> rank = megatron::LegacySaveRank(config, tp, pp, ep);
  if (!rank) return InvalidArgumentError(path + ": no rank of config " + config.ToString() + " saves this file");
  PTC_ASSIGN_OR_RETURN(RankView view, layout.View(*rank));
  if (view.model.empty()) return InvalidArgumentError(path + ": the schema gives this rank no tensor");
  PTC_ASSIGN_OR_RETURN(const megatron::NameSet names, megatron::FileNameSet(spec, view, tf.root, path));
  PTC_RETURN_IF_ERROR(megatron::CheckNameSetSplits(names, config.tp, view), path);
  view = megatron::ViewInNameSet(view, names);
  std::map<DType, size_t> votes;
  pickle::DictIndex index;
  for (const LocalTensor& t : view.model) {
    const pickle::Value* v = &tf.root;
    for (const std::string& key : megatron::ModelKeyPath(o.schema.name, t.name)) {
      v = index.Find(*v, key);
      if (v == nullptr) break;
    }
    if (v != nullptr && v->is_tensor()) votes[v->tensor().dtype]++;
  }
  if (votes.empty()) {
    return InvalidArgumentError(path + ": no tensor for " + view.model[0].name + " (is this a " + o.schema.name +
                                " checkpoint?)");
  }
  spec.dtype = votes.begin()->first;
  for (const auto& [dtype, n] : votes) {
    if (n > votes[spec.dtype]) spec.dtype = dtype;
  }
  return spec;
}

// One rank file of the tree, read (not yet CRC-checked: the import does,
// source.crcs) and kept (KeepRank).
Result<KeptRank> ReadAndKeep(Env* env, const Tree& tree, const ModelLayout& layout, int tp, int pp, int ep) {
  const std::string path = RankFile(tree, tp, pp, ep);
  if (!env->Exists(path)) return NotFoundError(path + ": missing");
  PTC_ASSIGN_OR_RETURN(auto file, env->OpenRead(path));
  PTC_ASSIGN_OR_RETURN(TorchFile tf, ReadTorchFile(*file, path));
  return KeepRank(*file, tf, layout, tp, pp, ep, path);
}

// source.open_rank and source.rank_file over the tree's files; each file's
// CRCs are left to the import (source.crcs: checked as it reads the tensors).
void SetRankFiles(Env* env, const Tree& tree, CheckpointSource* source) {
  source->crcs = std::make_shared<CrcLedger>();
  source->rank_file = [tree, config = source->config](int rank) {
    const RankCoords c = config.CoordsOf(rank);
    return RankFile(tree, c.tp, c.pp, c.ep);
  };
  source->open_rank = [env, tree, spec = source->spec, config = source->config,
                       crcs = source->crcs](const RankView& view) -> Result<std::unique_ptr<RankCheckpoint>> {
    const std::string path = RankFile(tree, view.coords.tp, view.coords.pp, view.coords.ep);
    if (!env->Exists(path)) return NotFoundError(path + ": missing");
    std::vector<std::unique_ptr<RandomAccessFile>> files;
    PTC_ASSIGN_OR_RETURN(files.emplace_back(), env->OpenRead(path));
    const RandomAccessFile& f = *files.back();
    PTC_ASSIGN_OR_RETURN(TorchFile tf, ReadTorchFile(f, path));
    crcs->Expect(path, tf.zip.members);
    PTC_ASSIGN_OR_RETURN(std::vector<pickle::Tensor> found,
                         megatron::FindRankTensors(spec, config, view, tf.root, path));
    std::map<std::string, RankCheckpoint::Location> where;
    size_t i = 0;
    for (const auto* list : {&view.model, &view.optim}) {
      for (const LocalTensor& t : *list) {
        const pickle::Tensor& p = found[i++];
        const TorchStorage* storage = tf.FindStorage(p.storage_key);
        where[t.name] = {&f,
                         storage->member.data_offset + static_cast<uint64_t>(p.storage_offset) * DTypeSize(p.dtype)};
      }
    }
    return std::make_unique<RankCheckpoint>(std::move(files), std::move(where));
  };
}

}  // namespace

Result<CheckpointSource> OpenMegatronCheckpoint(Env* env, const MegatronImportOptions& o) {
  PTC_ASSIGN_OR_RETURN(Tree tree, ScanTree(env, o));
  // The first rank's file: the grid (args), the dtype, whether there is
  // optimizer state, the kept entries.
  const std::string first = RankFile(tree, 0, 0, 0);
  if (tree.present.count({0, 0, 0}) == 0) {
    PTC_RETURN_IF_ERROR(CheckGrid(tree, "the other directories make " + GridText(tree.tp, tree.pp, tree.ep)));
  }
  if (!env->Exists(first)) return NotFoundError(first + ": missing");
  PTC_ASSIGN_OR_RETURN(auto file, env->OpenRead(first));
  PTC_ASSIGN_OR_RETURN(TorchFile tf, ReadTorchFile(*file, first));
  PTC_RETURN_IF_ERROR(SetGrid(tf.root, first, o.config, &tree));
  CheckpointSource source;
  PTC_RETURN_IF_ERROR(RefuseAmbiguousNames(tf.root, first, o, tree));
  source.config = SaveGrid(tree.tp, tree.pp, tree.ep);
  if (o.config) {
    if (o.config->tp != tree.tp || o.config->pp != tree.pp || o.config->ep != tree.ep) {
      return InvalidArgumentError("--config " + o.config->ToString() + " disagrees with " + tree.iter_dir + " (" +
                                  GridText(tree.tp, tree.pp, tree.ep) + ")");
    }
    source.config = *o.config;
  }
  PTC_ASSIGN_OR_RETURN(source.spec, SaveSpec(o, source.config, 0, 0, 0, tf, first));
  PTC_ASSIGN_OR_RETURN(const ModelLayout layout, ModelLayout::Make(source.spec, source.config));
  std::vector<KeptRank> kept;
  for (int pp = 0; pp < tree.pp; ++pp) {
    for (int ep = 0; ep < tree.ep; ++ep) {
      for (int tp = 0; tp < tree.tp; ++tp) {
        if (tp == 0 && pp == 0 && ep == 0) {
          PTC_ASSIGN_OR_RETURN(kept.emplace_back(), KeepRank(*file, tf, layout, 0, 0, 0, first));
        } else {
          PTC_ASSIGN_OR_RETURN(kept.emplace_back(), ReadAndKeep(env, tree, layout, tp, pp, ep));
        }
      }
    }
  }
  PTC_ASSIGN_OR_RETURN(megatron::MegatronState state,
                       FoldRanks(tree.iteration, tree.tp, tree.pp, std::move(kept), tree.ep));
  source.extra[std::string(megatron::kManifestKey)] = megatron::EncodeMegatronState(state);
  SetRankFiles(env, tree, &source);
  return source;
}

Result<MegatronSavePart> OpenMegatronSavePart(Env* env, const MegatronImportOptions& o) {
  if (!o.iteration) return InvalidArgumentError("a part of a save needs its iteration");
  MegatronSavePart part;
  const std::string iter_dir = JoinPath(o.dir, megatron::IterationDirName(*o.iteration));
  if (!env->IsDirectory(iter_dir)) return part;
  PTC_ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(iter_dir));
  if (std::none_of(names.begin(), names.end(), [](const std::string& n) { return n.starts_with("mp_rank_"); })) {
    return part;
  }
  PTC_ASSIGN_OR_RETURN(Tree tree, ScanTree(env, o));
  // The grid: the args of the first file here (every rank's file has them).
  const std::string first =
      JoinPath(JoinPath(tree.iter_dir, tree.dirs.front().first), std::string(megatron::kRankFile));
  PTC_ASSIGN_OR_RETURN(auto file, env->OpenRead(first));
  PTC_ASSIGN_OR_RETURN(TorchFile tf, ReadTorchFile(*file, first));
  PTC_ASSIGN_OR_RETURN(std::optional<int64_t> tp, megatron::ArgsInt(tf.root, "tensor_model_parallel_size", first));
  PTC_ASSIGN_OR_RETURN(std::optional<int64_t> pp, megatron::ArgsInt(tf.root, "pipeline_model_parallel_size", first));
  PTC_ASSIGN_OR_RETURN(std::optional<int64_t> ep, megatron::ArgsInt(tf.root, "expert_model_parallel_size", first));
  if (!tp || !pp) {
    if (!o.config) {
      return InvalidArgumentError(first +
                                  ": no args.tensor_model_parallel_size and pipeline_model_parallel_size "
                                  "give the save's grid (a save on many workers has only some rank files on each)");
    }
    tp = o.config->tp;
    pp = o.config->pp;
    ep = o.config->ep;
  }
  const int64_t e = ep.value_or(1);
  if (*tp < 1 || *pp < 1 || e < 1 || *tp > 1 << 16 || *pp > 1 << 16 || e > 1 << 16) {
    return InvalidArgumentError(first + ": args give " +
                                GridText(static_cast<int>(*tp), static_cast<int>(*pp), static_cast<int>(e)));
  }
  PTC_RETURN_IF_ERROR(ApplyGrid(static_cast<int>(*tp), static_cast<int>(*pp), static_cast<int>(e), &tree));
  for (const auto& [t, p, x] : tree.present) {
    if (t >= tree.tp || p >= tree.pp || x >= tree.ep) {
      return InvalidArgumentError(JoinPath(tree.iter_dir, DirName(tree, t, p, x)) +
                                  ": outside the save's grid (the args of " + first + " say " +
                                  GridText(tree.tp, tree.pp, tree.ep) + ")");
    }
  }
  part.source.config = SaveGrid(tree.tp, tree.pp, tree.ep);
  const auto [tp0, pp0, ep0] = *megatron::ResolveRankDir(tree.dirs.front().second, tree.with_pp, tree.with_ep);
  PTC_ASSIGN_OR_RETURN(part.source.spec, SaveSpec(o, part.source.config, tp0, pp0, ep0, tf, first));
  PTC_ASSIGN_OR_RETURN(const ModelLayout layout, ModelLayout::Make(part.source.spec, part.source.config));
  for (const auto& [t, p, x] : tree.present) {
    PTC_ASSIGN_OR_RETURN(part.kept.emplace_back(), ReadAndKeep(env, tree, layout, t, p, x));
  }
  SetRankFiles(env, tree, &part.source);
  return part;
}

// A kept rank travels as a one-rank MegatronState (EncodeMegatronState): its
// rng record and extra entries relabelled (0, 0) of a 1 x 1 grid, its own
// coordinates and file beside it.
nlohmann::json EncodeKeptRank(const KeptRank& rank) {
  megatron::MegatronState one = rank.kept;
  if (!one.rng.empty()) {
    one.rng[0].tp = one.rng[0].pp = one.rng[0].ep = 0;
    one.rng_tp = one.rng_pp = one.rng_ep = 1;
  }
  for (megatron::ExtraEntry& e : one.extra) e.tp = 0;
  if (!one.extra.empty()) one.extra_tp = 1;
  const nlohmann::json extra = {{std::string(megatron::kManifestKey), megatron::EncodeMegatronState(one)}};
  nlohmann::json j = {{"tp", static_cast<uint64_t>(rank.tp)},
                      {"pp", static_cast<uint64_t>(rank.pp)},
                      {"file", rank.file},
                      {"kept", extra}};
  if (rank.ep != 0) j["ep"] = static_cast<uint64_t>(rank.ep);
  return j;
}

Result<KeptRank> DecodeKeptRank(const nlohmann::json& j, const std::string& what) {
  if (!j.is_object() || !j.contains("tp") || !j["tp"].is_number_unsigned() || !j.contains("pp") ||
      !j["pp"].is_number_unsigned() || !j.contains("file") || !j["file"].is_string() || !j.contains("kept") ||
      !j["kept"].is_object() || j["tp"].get<uint64_t>() > 1 << 16 || j["pp"].get<uint64_t>() > 1 << 16) {
    return InvalidArgumentError(what + ": expected {tp, pp, file, kept}");
  }
  KeptRank rank{static_cast<int>(j["tp"].get<uint64_t>()),
                static_cast<int>(j["pp"].get<uint64_t>()),
                j["file"].get<std::string>(),
                {}};
  if (j.contains("ep")) {
    if (!j["ep"].is_number_unsigned() || j["ep"].get<uint64_t>() > 1 << 16) {
      return InvalidArgumentError(what + ": ep: expected a rank number");
    }
    rank.ep = static_cast<int>(j["ep"].get<uint64_t>());
  }
  PTC_ASSIGN_OR_RETURN(rank.kept, megatron::LoadMegatronState(j["kept"], what));
  if (rank.kept.rng.size() > 1) return InvalidArgumentError(what + ": more than one rng record");
  for (megatron::RankRng& r : rank.kept.rng) {
    r.tp = rank.tp;
    r.pp = rank.pp;
    r.ep = rank.ep;
  }
  for (megatron::ExtraEntry& e : rank.kept.extra) e.tp = rank.tp;
  rank.kept.rng_tp = rank.kept.rng_pp = rank.kept.extra_tp = 0;
  rank.kept.rng_ep = 1;
  return rank;
}

}  // namespace ptc
