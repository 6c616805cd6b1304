#include "ptc/checkpoint/megatron_import.h"

#include <charconv>
#include <map>
#include <set>

#include "ptc/checkpoint/megatron.h"
#include "ptc/checkpoint/megatron_extra.h"
#include "ptc/checkpoint/megatron_optimizer.h"
#include "ptc/format/torch_file.h"

namespace ptc {
namespace {

struct Tree {
  std::string iter_dir;
  uint64_t iteration = 0;
  int tp = 0, pp = 0;
  bool with_pp = false;                   // directories named mp_rank_TT_PPP
  std::set<std::pair<int, int>> present;  // (tp, pp) of the rank directories there
};

// The rank file of (tp, pp) as the directories name it.
std::string RankFile(const Tree& t, int tp, int pp) {
  return JoinPath(JoinPath(t.iter_dir, megatron::RankDirName(tp, pp, t.with_pp ? 2 : 1)),
                  std::string(megatron::kRankFile));
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
  std::set<bool> with_pp;
  for (const std::string& name : names) {
    if (!name.starts_with("mp_rank_")) continue;
    PTC_ASSIGN_OR_RETURN(megatron::RankDir d, megatron::ParseRankDirName(name), t.iter_dir);
    t.present.insert({d.tp_rank, d.pp_rank < 0 ? 0 : d.pp_rank});
    with_pp.insert(d.pp_rank >= 0);
  }
  if (t.present.empty()) return NotFoundError(t.iter_dir + ": no mp_rank_* directory");
  if (with_pp.size() > 1) return InvalidArgumentError(t.iter_dir + ": mp_rank_TT and mp_rank_TT_PPP directories mixed");
  for (const auto& [tp, pp] : t.present) {
    t.tp = std::max(t.tp, tp + 1);
    t.pp = std::max(t.pp, pp + 1);
  }
  t.with_pp = *with_pp.begin();
  return t;
}

// Every rank directory of the tp x pp grid is there, and no other; `why`
// says where the grid comes from.
Status CheckGrid(const Tree& t, const std::string& why) {
  for (int pp = 0; pp < t.pp; ++pp) {
    for (int tp = 0; tp < t.tp; ++tp) {
      if (t.present.count({tp, pp}) == 0) {
        return NotFoundError(JoinPath(t.iter_dir, megatron::RankDirName(tp, pp, t.with_pp ? 2 : 1)) + ": missing (" +
                             why + ")");
      }
    }
  }
  for (const auto& [tp, pp] : t.present) {
    if (tp >= t.tp || pp >= t.pp) {
      return InvalidArgumentError(JoinPath(t.iter_dir, megatron::RankDirName(tp, pp, t.with_pp ? 2 : 1)) +
                                  ": outside the save's grid (" + why + ")");
    }
  }
  return Status::OK();
}

std::string GridText(int tp, int pp) { return "tp=" + std::to_string(tp) + ", pp=" + std::to_string(pp); }

// The grid: tensor_model_parallel_size and pipeline_model_parallel_size of
// the first rank's args when it has them (a partial save then names the
// missing rank), else the directories present.
Status SetGrid(const pickle::Value& first_root, const std::string& first, Tree* t) {
  PTC_ASSIGN_OR_RETURN(std::optional<int64_t> tp, megatron::ArgsInt(first_root, "tensor_model_parallel_size", first));
  PTC_ASSIGN_OR_RETURN(std::optional<int64_t> pp, megatron::ArgsInt(first_root, "pipeline_model_parallel_size", first));
  if (!tp || !pp) return CheckGrid(*t, "the other directories make " + GridText(t->tp, t->pp));
  if (*tp < 1 || *pp < 1 || *tp > 1 << 16 || *pp > 1 << 16) {
    return InvalidArgumentError(first + ": args give " + GridText(static_cast<int>(*tp), static_cast<int>(*pp)));
  }
  t->tp = static_cast<int>(*tp);
  t->pp = static_cast<int>(*pp);
  t->with_pp = t->with_pp || t->pp > 1;  // Megatron names mp_rank_TT_PPP when pp > 1
  return CheckGrid(*t, "the args of " + first + " say " + GridText(t->tp, t->pp));
}

// True when `root` holds optimizer state in the layout ptcfs renders.
bool HasOptimizer(const pickle::Value& root) {
  const pickle::Value* o = root.Find("optimizer");
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
    t.storage_key = c.key;
    t.storage_numel = c.numel;
    t.storage_offset = 0;
    t.stride.assign(t.shape.size(), 1);
    for (size_t i = t.shape.size(); i-- > 1;) t.stride[i - 1] = t.stride[i] * t.shape[i];
    out->push_back(std::move(c));
  });
  return error;
}

// One rank's 'rng_state' with its tensors' bytes.
Result<megatron::RankRng> KeepRng(const RandomAccessFile& file, const TorchFile& tf, int tp, int pp,
                                  const std::string& what) {
  const pickle::Value* rng = tf.root.Find("rng_state");
  if (rng == nullptr) return InvalidArgumentError(what + ": rng_state: missing (the first rank's file has one)");
  megatron::RankRng out{tp, pp, *rng, {}};
  PTC_RETURN_IF_ERROR(KeepTensors(file, tf, "r", what + ": rng_state", &out.value, &out.tensors));
  return out;
}

// The `*._extra_state` entries of one rank's flat model dict (Megatron-Core),
// named globally, with their tensors' bytes; an entry another pp rank of the
// same tp rank kept under the same global name already is not kept again.
Status KeepExtras(const RankView& view, const RandomAccessFile& file, const TorchFile& tf, const std::string& what,
                  std::set<std::pair<int, std::string>>* seen, megatron::MegatronState* state) {
  const pickle::Value* model = tf.root.Find("model");
  if (model == nullptr || !model->is_dict() || view.model.empty()) return Status::OK();
  for (const auto& [key, value] : model->pairs()) {
    if (key.kind() != pickle::Kind::kStr || !megatron::IsExtraStateKey(key.as_str())) continue;
    megatron::ExtraName name = megatron::GlobalExtraName(view, key.as_str());
    if (!seen->insert({view.coords.tp, name.key}).second) continue;
    megatron::ExtraEntry e{view.coords.tp, std::move(name.key), std::move(name.anchor), value, {}};
    const std::string prefix = "x" + std::to_string(state->extra.size()) + "_";
    PTC_RETURN_IF_ERROR(KeepTensors(file, tf, prefix, what + ": model/" + key.as_str(), &e.value, &e.tensors));
    state->extra.push_back(std::move(e));
  }
  return Status::OK();
}

// The `step` of every parameter of `view` in the rank file `tf` (each kept
// once per global parameter: the first of its shards, which the others must
// equal), into meta->steps. `step_of` maps global names to meta->steps.
Status KeepSteps(const RankView& view, const megatron::OptimizerLayout& layout, const RandomAccessFile& file,
                 const TorchFile& tf, const std::string& what, std::map<std::string, size_t>* step_of,
                 megatron::OptimizerMeta* meta) {
  const pickle::Value* state = tf.root.Find("optimizer")->Find("optimizer")->Find("state");
  pickle::DictIndex index;  // state holds an entry per parameter
  for (size_t i = 0; i < view.model.size() && state != nullptr; ++i) {
    const pickle::Value* entry = index.Find(*state, layout.slots[i].key);
    const pickle::Value* step = entry == nullptr ? nullptr : entry->Find("step");
    if (step == nullptr || view.model[i].segments.empty()) continue;
    const std::string where = what + ": optimizer/optimizer/state/" + layout.slots[i].key.DebugString() + "/step";
    megatron::StepValue value{{view.model[i].segments[0].tensor}, *step, {}};
    if (step->is_tensor()) {
      pickle::Tensor& t = value.value.tensor();
      if (TensorNumBytes(t) > 64) return InvalidArgumentError(where + ": a tensor of more than one number");
      PTC_ASSIGN_OR_RETURN(std::string bytes, ReadTensorBytes(file, tf, t, where));
      value.tensors.push_back({"s", t.dtype, TensorNumElements(t), std::move(bytes)});
      t.storage_key = "s";
      t.storage_numel = TensorNumElements(t);
      t.storage_offset = 0;
      t.stride.assign(t.shape.size(), 1);
      for (size_t d = t.shape.size(); d-- > 1;) t.stride[d - 1] = t.stride[d] * t.shape[d];
    } else if (step->kind() != pickle::Kind::kInt && step->kind() != pickle::Kind::kFloat) {
      return InvalidArgumentError(where + ": a " + std::string(pickle::KindName(step->kind())) +
                                  ", not a tensor or a number");
    }
    auto same = [&](const megatron::StepValue& s) {
      return s.value == value.value && (s.tensors.empty() || s.tensors[0].bytes == value.tensors[0].bytes);
    };
    const std::string& name = value.params[0];
    if (const auto it = step_of->find(name); it != step_of->end()) {
      if (!same(meta->steps[it->second])) {
        return InvalidArgumentError(where + ": differs from the step of " + name +
                                    " in another rank's file (a parameter's shards share one step)");
      }
      continue;
    }
    size_t k = 0;
    while (k < meta->steps.size() && !same(meta->steps[k])) ++k;
    if (k == meta->steps.size()) {
      meta->steps.push_back(std::move(value));
    } else {
      meta->steps[k].params.push_back(name);
    }
    (*step_of)[name] = k;
  }
  return Status::OK();
}

// The first rank's entries besides the model and optimizer state (and the
// rng state), with the bytes of their tensors copied out of the file; the
// 'rng_state' of every rank of the grid, kept per rank; every rank's
// `*._extra_state` model entries (megatron_extra.h); the optimizer's
// group settings (the first rank's) and every parameter's step.
Result<megatron::MegatronState> KeepEntries(Env* env, const RandomAccessFile& file, const TorchFile& tf,
                                            const Tree& tree, const CheckpointSource& source,
                                            const std::string& what) {
  megatron::MegatronState state{tree.iteration, megatron::CarriedEntries(tf.root), {}};
  const bool per_rank_rng = state.carried.Erase("rng_state");
  PTC_RETURN_IF_ERROR(KeepTensors(file, tf, "c", what, &state.carried, &state.tensors));
  if (per_rank_rng) {
    state.rng_tp = tree.tp;
    state.rng_pp = tree.pp;
  }
  std::map<std::string, size_t> step_of;
  std::set<std::pair<int, std::string>> extras_seen;
  for (int pp = 0; pp < tree.pp; ++pp) {
    for (int tp = 0; tp < tree.tp; ++tp) {
      const std::string path = RankFile(tree, tp, pp);
      std::unique_ptr<RandomAccessFile> f;
      std::optional<TorchFile> rank_tf;
      if (tp != 0 || pp != 0) {
        if (!env->Exists(path)) return NotFoundError(path + ": missing");
        PTC_ASSIGN_OR_RETURN(f, env->OpenRead(path));
        PTC_ASSIGN_OR_RETURN(rank_tf, ReadTorchFile(*f, path));
      }
      const RandomAccessFile& rf = f ? *f : file;
      const TorchFile& rtf = rank_tf ? *rank_tf : tf;
      if (per_rank_rng) {
        PTC_ASSIGN_OR_RETURN(state.rng.emplace_back(), KeepRng(rf, rtf, tp, pp, path));
      }
      PTC_ASSIGN_OR_RETURN(RankView view,
                           ComputeView(source.spec, source.config, source.config.RankOf(RankCoords{tp, 0, pp})));
      // The rank's tensors as the file names and numbers them (either of Megatron-Core's name sets).
      PTC_ASSIGN_OR_RETURN(const megatron::NameSet names, megatron::FileNameSet(source.spec, view, rtf.root, path));
      view = megatron::ViewInNameSet(view, names);
      PTC_RETURN_IF_ERROR(KeepExtras(view, rf, rtf, path, &extras_seen, &state));
      if (!source.spec.optimizer || source.config.zero == 1) continue;
      const pickle::Value* optimizer = rtf.root.Find("optimizer");
      if (optimizer == nullptr) return InvalidArgumentError(path + ": optimizer: missing (the first rank's file has one)");
      PTC_ASSIGN_OR_RETURN(megatron::OptimizerLayout layout, megatron::ReadOptimizerLayout(view, *optimizer, path));
      if (tp == 0 && pp == 0) state.optimizer.groups = megatron::GroupSettings(layout, *optimizer);
      PTC_RETURN_IF_ERROR(KeepSteps(view, layout, rf, rtf, path, &step_of, &state.optimizer));
    }
  }
  if (!state.extra.empty()) state.extra_tp = tree.tp;
  return state;
}

}  // namespace

Result<CheckpointSource> OpenMegatronCheckpoint(Env* env, const MegatronImportOptions& o) {
  PTC_ASSIGN_OR_RETURN(Tree tree, ScanTree(env, o));
  // The first rank's file: the grid (args), the dtype, whether there is
  // optimizer state, the kept entries.
  const std::string first = RankFile(tree, 0, 0);
  if (tree.present.count({0, 0}) == 0) {
    PTC_RETURN_IF_ERROR(CheckGrid(tree, "the other directories make " + GridText(tree.tp, tree.pp)));
  }
  if (!env->Exists(first)) return NotFoundError(first + ": missing");
  PTC_ASSIGN_OR_RETURN(auto file, env->OpenRead(first));
  PTC_ASSIGN_OR_RETURN(TorchFile tf, ReadTorchFile(*file, first));
  PTC_RETURN_IF_ERROR(SetGrid(tf.root, first, &tree));
  CheckpointSource source;
  source.config.tp = tree.tp;
  source.config.pp = tree.pp;
  if (o.config) {
    if (o.config->tp != tree.tp || o.config->pp != tree.pp) {
      return InvalidArgumentError("--config " + o.config->ToString() + " disagrees with " + tree.iter_dir + " (" +
                                  GridText(tree.tp, tree.pp) + ")");
    }
    source.config = *o.config;
  }
  source.spec = ModelSpec{o.schema, o.dims, DType::kF32, HasOptimizer(tf.root)};
  {
    PTC_RETURN_IF_ERROR(ValidateConfig(source.spec, source.config));
    PTC_ASSIGN_OR_RETURN(RankView view, ComputeView(source.spec, source.config, 0));
    if (view.model.empty()) return InvalidArgumentError(first + ": the schema gives rank 0 no tensor");
    PTC_ASSIGN_OR_RETURN(const megatron::NameSet names, megatron::FileNameSet(source.spec, view, tf.root, first));
    view = megatron::ViewInNameSet(view, names);
    // The dtype most of rank 0's parameters have: one tensor of another dtype
    // is then blamed by name (FindRankTensors), not every other tensor.
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
      return InvalidArgumentError(first + ": no tensor for " + view.model[0].name + " (is this a " + o.schema.name +
                                  " checkpoint?)");
    }
    source.spec.dtype = votes.begin()->first;
    for (const auto& [dtype, n] : votes) {
      if (n > votes[source.spec.dtype]) source.spec.dtype = dtype;
    }
  }
  PTC_RETURN_IF_ERROR(VerifyTorchFileCrcs(*file, tf, first));
  PTC_ASSIGN_OR_RETURN(megatron::MegatronState kept, KeepEntries(env, *file, tf, tree, source, first));
  source.extra[std::string(megatron::kManifestKey)] = megatron::EncodeMegatronState(kept);
  source.rank_file = [tree, config = source.config](int rank) {
    const RankCoords c = config.CoordsOf(rank);
    return RankFile(tree, c.tp, c.pp);
  };
  // CRCs are checked once per file; the first rank's were checked above.
  auto verified = std::make_shared<std::set<std::string>>(std::set<std::string>{first});
  source.open_rank = [env, tree, spec = source.spec, config = source.config,
                      verified](const RankView& view) -> Result<std::unique_ptr<RankCheckpoint>> {
    const std::string path = RankFile(tree, view.coords.tp, view.coords.pp);
    if (!env->Exists(path)) return NotFoundError(path + ": missing");
    std::vector<std::unique_ptr<RandomAccessFile>> files;
    PTC_ASSIGN_OR_RETURN(files.emplace_back(), env->OpenRead(path));
    const RandomAccessFile& f = *files.back();
    PTC_ASSIGN_OR_RETURN(TorchFile tf, ReadTorchFile(f, path));
    if (verified->insert(path).second) PTC_RETURN_IF_ERROR(VerifyTorchFileCrcs(f, tf, path));
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
  return source;
}

}  // namespace ptc
