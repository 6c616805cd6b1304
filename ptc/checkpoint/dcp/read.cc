#include "ptc/checkpoint/dcp/read.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "ptc/base/file_range.h"
#include "ptc/base/json_fields.h"
#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/dcp/dist_optimizer_read.h"
#include "ptc/checkpoint/dcp/entries.h"
#include "ptc/checkpoint/megatron/dist_optimizer.h"
#include "ptc/format/pickle.h"
#include "ptc/format/torch_file.h"
#include "ptc/model/model_layout.h"
#include "ptc/model/view.h"
#include "ptc/store/generation_writer.h"

namespace ptc::dcp {
namespace {

using pickle::Kind;
using pickle::Value;

constexpr std::string_view kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr size_t kCopyBytes = 4 << 20;

Status Bad(const std::string& where, const std::string& what) { return InvalidArgumentError(where + ": " + what); }

// The BUILD state of an object of class `cls` (module.name).
Result<const Value*> StateOf(const Value& v, std::string_view cls, const std::string& where) {
  if (v.kind() != Kind::kObject || v.object().callable.FullName() != cls) {
    return Bad(where, "is a " + std::string(KindName(v.kind())) + ", not a " + std::string(cls));
  }
  if (!v.object().state) return Bad(where, std::string(cls) + " without its state");
  return v.object().state.get();
}

Result<const Value*> Field(const Value& state, std::string_view name, const std::string& where) {
  const Value* f = state.is_dict() ? state.Find(name) : nullptr;
  if (f == nullptr) return Bad(where, "no field '" + std::string(name) + "'");
  return f;
}

Result<int64_t> NonNegative(const Value& v, const std::string& where) {
  if (v.kind() != Kind::kInt || v.as_int() < 0) return Bad(where, "is not a non-negative int");
  return v.as_int();
}

// A torch.Size (or a plain tuple) of non-negative ints.
Result<std::vector<Index>> Ints(const Value& v, const std::string& where) {
  const Value* tuple = &v;
  if (v.kind() == Kind::kObject && v.object().callable.FullName() == "torch.Size" && v.object().args.size() == 1) {
    tuple = &v.object().args[0];
  }
  if (!tuple->is_sequence()) return Bad(where, "is a " + std::string(KindName(v.kind())) + ", not a torch.Size");
  std::vector<Index> out;
  for (const Value& i : tuple->items()) {
    PTC_ASSIGN_OR_RETURN(int64_t n, NonNegative(i, where));
    out.push_back(n);
  }
  return out;
}

Result<std::string> Str(const Value& v, const std::string& where) {
  if (v.kind() != Kind::kStr) return Bad(where, "is not a str");
  return v.as_str();
}

Result<DType> DTypeOf(const Value& properties, const std::string& where) {
  PTC_ASSIGN_OR_RETURN(const Value* state,
                       StateOf(properties, std::string(kMetadataModule) + ".TensorProperties", where + ": properties"));
  const Value* dtype = nullptr;
  if (state->is_sequence() && !state->items().empty()) dtype = &state->items()[0];
  if (state->is_dict()) dtype = state->Find("dtype");
  if (dtype == nullptr || dtype->kind() != Kind::kGlobal || dtype->global().module != "torch") {
    return Bad(where, "properties without a torch dtype");
  }
  static const std::map<std::string, DType, std::less<>> kDTypes = {{"float64", DType::kF64},
                                                                    {"double", DType::kF64},
                                                                    {"float32", DType::kF32},
                                                                    {"float", DType::kF32},
                                                                    {"float16", DType::kF16},
                                                                    {"half", DType::kF16},
                                                                    {"bfloat16", DType::kBF16},
                                                                    {"int64", DType::kI64},
                                                                    {"long", DType::kI64},
                                                                    {"int32", DType::kI32},
                                                                    {"int", DType::kI32},
                                                                    {"int16", DType::kI16},
                                                                    {"short", DType::kI16},
                                                                    {"int8", DType::kI8},
                                                                    {"uint8", DType::kU8},
                                                                    {"bool", DType::kBool},
                                                                    {"float8_e4m3fn", DType::kF8E4M3},
                                                                    {"float8_e5m2", DType::kF8E5M2}};
  auto it = kDTypes.find(dtype->global().name);
  if (it == kDTypes.end()) return Bad(where, "dtype torch." + dtype->global().name + " is not carried by ptcfs");
  return it->second;
}

bool PlainName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

std::string ChunkName(const SavedTensor& t, const SavedChunk& c) {
  return "key " + t.key + ", chunk " + c.box.ToString() + " (" + c.file + " bytes " + std::to_string(c.offset) + "+" +
         std::to_string(c.length) + ")";
}

// The store's pieces of a saved chunk `box` (of the key's tensor) of `t`,
// whose dense bytes are at `at` in file `file`: a block taken whole is a run
// of those bytes; a woven block's rows are one piece of its runs' boxes.
void AddBlockChunks(const Tensor& t, const Box& box, size_t file, uint64_t at, std::vector<DcpSource::Chunk>* out) {
  const uint64_t elem = DTypeSize(t.dtype);
  for (const RowBlock& b : t.blocks) {
    Tensor one = t;
    one.blocks = {b};
    std::vector<Segment> segments = ChunkSegments(one, box);
    if (segments.empty()) continue;
    if (b.src.size() == 1) {
      const Segment& s = segments.front();
      out->push_back(DcpSource::Chunk{t.name, t.dtype, s.box, file, at + static_cast<uint64_t>(s.layout.offset) * elem,
                                      static_cast<uint64_t>(s.box.volume()) * elem});
      continue;
    }
    Index base = segments.front().layout.offset, elements = 0;
    for (const Segment& s : segments) {
      base = std::min(base, s.layout.offset);
      elements += s.box.volume();
    }
    for (Segment& s : segments) s.layout.offset -= base;
    out->push_back(DcpSource::Chunk{t.name, t.dtype, Box{}, file, at + static_cast<uint64_t>(base) * elem,
                                    static_cast<uint64_t>(elements) * elem, std::move(segments)});
  }
}

}  // namespace

namespace {

// The chunks `chunks[lo, hi)`, which share every dimension of `dims` before
// position `at`, overlap nowhere: a sweep along dims[at]. Sorted by their
// interval there, a run of chunks with the same interval (a band of a grid)
// is checked along the next dimension, and a chunk is compared whole only
// with those of other intervals that start before it ends (none in a grid,
// rows or columns: each pass is a sort).
Status SweepDisjoint(const SavedTensor& t, std::vector<const SavedChunk*>& chunks, size_t lo, size_t hi,
                     const std::vector<size_t>& dims, size_t at, const std::string& what) {
  if (hi - lo < 2) return Status::OK();
  if (at == dims.size()) {  // the same box twice (non-empty)
    return Bad(what, ChunkName(t, *chunks[lo + 1]) + " overlaps chunk " + chunks[lo]->box.ToString());
  }
  const size_t d = dims[at];
  std::sort(chunks.begin() + static_cast<ptrdiff_t>(lo), chunks.begin() + static_cast<ptrdiff_t>(hi),
            [d](const SavedChunk* a, const SavedChunk* b) {
              return std::pair(a->box.begin[d], a->box.end[d]) < std::pair(b->box.begin[d], b->box.end[d]);
            });
  for (size_t band = lo; band < hi;) {
    size_t next = band + 1;
    while (next < hi && chunks[next]->box.begin[d] == chunks[band]->box.begin[d] &&
           chunks[next]->box.end[d] == chunks[band]->box.end[d]) {
      ++next;
    }
    PTC_RETURN_IF_ERROR(SweepDisjoint(t, chunks, band, next, dims, at + 1, what));
    for (size_t i = band; i < next; ++i) {
      for (size_t j = next; j < hi && chunks[j]->box.begin[d] < chunks[i]->box.end[d]; ++j) {
        if (Intersect(chunks[i]->box, chunks[j]->box)) {
          return Bad(what, ChunkName(t, *chunks[j]) + " overlaps chunk " + chunks[i]->box.ToString());
        }
      }
    }
    band = next;
  }
  return Status::OK();
}

}  // namespace

// Sweeps along the dimensions in the order of how much the chunks' begins
// differ there, most first (SweepDisjoint).
Status CheckChunksDisjoint(const SavedTensor& t, const std::string& metadata_path) {
  std::vector<const SavedChunk*> chunks;
  for (const SavedChunk& c : t.chunks) {
    if (c.box.volume() > 0) chunks.push_back(&c);
  }
  const size_t rank = t.shape.size();
  std::vector<std::pair<size_t, size_t>> distinct;  // (distinct begins, dimension)
  for (size_t d = 0; d < rank; ++d) {
    std::vector<Index> begins;
    begins.reserve(chunks.size());
    for (const SavedChunk* c : chunks) begins.push_back(c->box.begin[d]);
    std::sort(begins.begin(), begins.end());
    distinct.emplace_back(static_cast<size_t>(std::unique(begins.begin(), begins.end()) - begins.begin()), d);
  }
  std::sort(distinct.begin(), distinct.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<size_t> dims;
  for (const auto& [count, d] : distinct) dims.push_back(d);
  return SweepDisjoint(t, chunks, 0, chunks.size(), dims, 0, metadata_path);
}

Result<SavedCheckpoint> ParseMetadata(std::string_view data, const std::string& what) {
  PTC_ASSIGN_OR_RETURN(Value root, pickle::Unpickle(data, what));
  PTC_ASSIGN_OR_RETURN(const Value* meta, StateOf(root, std::string(kMetadataModule) + ".Metadata", what));
  PTC_ASSIGN_OR_RETURN(const Value* entries, Field(*meta, "state_dict_metadata", what));
  PTC_ASSIGN_OR_RETURN(const Value* storage, Field(*meta, "storage_data", what));
  if (!entries->is_dict() || !storage->is_dict()) return Bad(what, "state_dict_metadata or storage_data is not a dict");
  // (key, chunk offsets) -> storage record.
  std::map<std::pair<std::string, std::vector<Index>>, SavedChunk> where;
  for (const auto& [index, info] : storage->pairs()) {
    const std::string at = what + ": storage_data";
    PTC_ASSIGN_OR_RETURN(const Value* i, StateOf(index, std::string(kMetadataModule) + ".MetadataIndex", at));
    PTC_ASSIGN_OR_RETURN(const Value* fqn_value, Field(*i, "fqn", at));
    PTC_ASSIGN_OR_RETURN(std::string fqn, Str(*fqn_value, at + " fqn"));
    const std::string entry = at + " of " + fqn;
    const Value* offset_value = i->is_dict() ? i->Find("offset") : nullptr;  // absent or None: a bytes entry
    std::vector<Index> offsets;
    if (offset_value != nullptr && !offset_value->is_none()) {
      PTC_ASSIGN_OR_RETURN(offsets, Ints(*offset_value, entry + " offset"));
    }
    PTC_ASSIGN_OR_RETURN(const Value* s, StateOf(info, "torch.distributed.checkpoint.filesystem._StorageInfo", entry));
    SavedChunk c;
    PTC_ASSIGN_OR_RETURN(const Value* path, Field(*s, "relative_path", entry));
    PTC_ASSIGN_OR_RETURN(c.file, Str(*path, entry + " relative_path"));
    if (!PlainName(c.file)) return Bad(entry, "relative_path '" + c.file + "' is not a file name of the directory");
    PTC_ASSIGN_OR_RETURN(const Value* offset, Field(*s, "offset", entry));
    PTC_ASSIGN_OR_RETURN(const Value* length, Field(*s, "length", entry));
    PTC_ASSIGN_OR_RETURN(int64_t o, NonNegative(*offset, entry + " offset"));
    PTC_ASSIGN_OR_RETURN(int64_t n, NonNegative(*length, entry + " length"));
    c.offset = static_cast<uint64_t>(o);
    c.length = static_cast<uint64_t>(n);
    if (const Value* t = s->Find("transform_descriptors");
        t != nullptr && !t->is_none() && !(t->is_sequence() && t->items().empty())) {
      return Bad(entry, "carries transforms (compression); ptcfs reads plain chunks only");
    }
    if (!where.emplace(std::make_pair(fqn, offsets), std::move(c)).second) return Bad(entry, "repeats");
  }
  SavedCheckpoint out;
  for (const auto& [key_value, entry_value] : entries->pairs()) {
    PTC_ASSIGN_OR_RETURN(std::string key, Str(key_value, what + ": a state_dict_metadata key"));
    const std::string at = what + ": " + key;
    if (entry_value.kind() == Kind::kObject &&
        entry_value.object().callable.FullName() == std::string(kMetadataModule) + ".BytesStorageMetadata") {
      SavedBytes b{key};
      if (auto it = where.find({key, {}}); it != where.end()) {
        b.file = it->second.file;
        b.offset = it->second.offset;
        b.length = it->second.length;
      }
      out.bytes.push_back(std::move(b));
      continue;
    }
    PTC_ASSIGN_OR_RETURN(const Value* e,
                         StateOf(entry_value, std::string(kMetadataModule) + ".TensorStorageMetadata", at));
    SavedTensor t;
    t.key = key;
    PTC_ASSIGN_OR_RETURN(const Value* properties, Field(*e, "properties", at));
    PTC_ASSIGN_OR_RETURN(t.dtype, DTypeOf(*properties, at));
    PTC_ASSIGN_OR_RETURN(const Value* size, Field(*e, "size", at));
    PTC_ASSIGN_OR_RETURN(t.shape, Ints(*size, at + " size"));
    PTC_ASSIGN_OR_RETURN(const Value* chunks, Field(*e, "chunks", at));
    if (!chunks->is_sequence()) return Bad(at, "chunks is not a list");
    for (const Value& chunk : chunks->items()) {
      PTC_ASSIGN_OR_RETURN(const Value* c, StateOf(chunk, std::string(kMetadataModule) + ".ChunkStorageMetadata", at));
      PTC_ASSIGN_OR_RETURN(const Value* offsets_value, Field(*c, "offsets", at));
      PTC_ASSIGN_OR_RETURN(const Value* sizes_value, Field(*c, "sizes", at));
      PTC_ASSIGN_OR_RETURN(std::vector<Index> offsets, Ints(*offsets_value, at + " chunk offsets"));
      PTC_ASSIGN_OR_RETURN(std::vector<Index> sizes, Ints(*sizes_value, at + " chunk sizes"));
      if (offsets.size() != t.shape.size() || sizes.size() != t.shape.size()) {
        return Bad(at,
                   "a chunk's offsets or sizes do not have the tensor's " + std::to_string(t.shape.size()) + " dims");
      }
      Box box{offsets, offsets};
      for (size_t d = 0; d < t.shape.size(); ++d) {
        if (sizes[d] > t.shape[d] || offsets[d] > t.shape[d] - sizes[d]) {
          return Bad(at, "chunk at " + ShapeToString(offsets) + " of sizes " + ShapeToString(sizes) + " lies outside " +
                             ShapeToString(t.shape));
        }
        box.end[d] = offsets[d] + sizes[d];
      }
      auto it = where.find({key, offsets});
      if (it == where.end()) return Bad(at, "no storage record for the chunk at " + ShapeToString(offsets));
      SavedChunk saved = it->second;
      saved.box = std::move(box);
      t.chunks.push_back(std::move(saved));
    }
    out.tensors.push_back(std::move(t));
  }
  return out;
}

std::string TensorOfKey(const std::string& key) {
  constexpr std::string_view kModel = "model.", kOptim = "optim.state.";
  if (key.rfind(kModel, 0) == 0 && key.size() > kModel.size()) return key.substr(kModel.size());
  if (key.rfind(kOptim, 0) != 0) return "";
  for (const char* kind : kOptimizerKinds) {
    const std::string suffix = std::string(".") + kind;
    if (key.size() > kOptim.size() + suffix.size() &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return key.substr(kOptim.size());
    }
  }
  return "";
}

Result<std::string> ReadMetadata(Env* env, const std::string& dir) {
  const std::string metadata_path = JoinPath(dir, kMetadataFile);
  PTC_ASSIGN_OR_RETURN(auto metadata_file, env->OpenRead(metadata_path));
  if (metadata_file->Size() > kMaxTorchPickleSize) {
    return Bad(metadata_path, "larger than " + std::to_string(kMaxTorchPickleSize) + " bytes");
  }
  std::string metadata(metadata_file->Size(), '\0');
  PTC_RETURN_IF_ERROR(metadata_file->Read(0, metadata.size(), metadata.data()));
  return metadata;
}

Status CheckMcoreMetadata(Env* env, const std::string& dir) {
  const std::string path = JoinPath(dir, kMcoreMetadataFile);
  PTC_ASSIGN_OR_RETURN(auto file, env->OpenRead(path));
  if (file->Size() > (1u << 20)) return Bad(path, "larger than 1 MiB: no Megatron-Core metadata.json");
  std::string text(file->Size(), '\0');
  PTC_RETURN_IF_ERROR(file->Read(0, text.size(), text.data()));
  std::string duplicate;
  const nlohmann::json j = ParseJsonUniqueKeys(text, &duplicate);
  if (!duplicate.empty()) return Bad(path, "names \"" + Abbreviate(duplicate) + "\" twice");
  if (!j.is_object()) return Bad(path, "not a JSON object (Megatron-Core writes its backends there)");
  for (const auto& [key, want] :
       {std::pair<const char*, const char*>{"sharded_backend", "torch_dist"}, {"common_backend", "torch"}}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string() || it->get<std::string>() != want) {
      return Bad(path, std::string("\"") + key + "\" is " + (it == j.end() ? std::string("missing") : JsonText(*it)) +
                           "; ptcfs takes Megatron-Core's " + want + " (docs/dcp_format.md, torch_dist)");
    }
  }
  return Status::OK();
}

Result<DcpSource> OpenDcp(Env* env, const std::string& dir, const Schema& schema, const ModelDims& dims,
                          const ParallelConfig& config, Keys keys, megatron::NameSet names) {
  PTC_ASSIGN_OR_RETURN(const std::string metadata, ReadMetadata(env, dir));
  return OpenDcpPart(env, dir, metadata, schema, dims, config, keys, /*part=*/false, names);
}

namespace {

// A save into dcp/ may name its tensors as torch flattens {"model", "optim"}
// or as torchtitan does (docs/dcp_format.md, Keys).
Keys SavedKeys(const SavedCheckpoint& saved, Keys keys) {
  if (keys == Keys::kTorch && std::any_of(saved.tensors.begin(), saved.tensors.end(),
                                          [](const SavedTensor& t) { return t.key == "tok_embeddings.weight"; })) {
    return Keys::kTorchtitan;
  }
  return keys;
}

// Tensor entries that are no stored tensor: Adam's steps (SavedOptimizer's),
// torchtitan's other states (SavedEntries').
bool PassedOver(const std::string& full_key, Keys keys) {
  const std::string key(keys == Keys::kMegatronCore ? WithoutChainedPrefix(full_key).first : full_key);
  const bool step = key.rfind(keys == Keys::kTorch ? "optim.state." : "optimizer.state.", 0) == 0 && key.size() > 5 &&
                    key.compare(key.size() - 5, 5, ".step") == 0;
  return (step && keys != Keys::kMegatronCore) || CarriedTensorKey(key, keys);
}

std::string OptimizerPrefix(Keys keys) { return keys == Keys::kTorch ? "optim." : "optimizer."; }

// The model the save holds: the parameters' dtype, and optimizer state when it has some.
Result<ModelSpec> SavedSpec(const SavedCheckpoint& saved, const Schema& schema, const ModelDims& dims, Keys keys,
                            const std::string& metadata_path) {
  ModelSpec spec;
  spec.schema = schema;
  spec.dims = dims;
  std::optional<DType> param_dtype;
  std::string a_param;
  for (const SavedTensor& t : saved.tensors) {
    if (PassedOver(t.key, keys)) continue;
    const std::string_view key = keys == Keys::kMegatronCore ? WithoutChainedPrefix(t.key).first : t.key;
    if (key.starts_with(OptimizerPrefix(keys))) {
      spec.optimizer = true;
      continue;
    }
    if (param_dtype && *param_dtype != t.dtype) {
      return Bad(metadata_path, "key " + t.key + " is " + std::string(DTypeName(t.dtype)) +
                                    " but other parameters are " + std::string(DTypeName(*param_dtype)));
    }
    param_dtype = t.dtype;
    a_param = t.key;
  }
  if (param_dtype) spec.dtype = *param_dtype;
  if (keys == Keys::kTorchtitan && spec.optimizer && spec.dtype != DType::kF32) {
    return Bad(metadata_path, "key " + a_param + " is " + std::string(DTypeName(spec.dtype)) +
                                  ": torchtitan keeps no fp32 masters beside its parameters, so a save with "
                                  "optimizer state needs float32 parameters (docs/dcp_format.md)");
  }
  return spec;
}

// Whether a torch_dist save holds Megatron-Core's ChainedOptimizer's keys (chained_N.optimizer.*).
bool ChainedSave(const SavedCheckpoint& saved, Keys keys) {
  return keys == Keys::kMegatronCore &&
         std::any_of(saved.tensors.begin(), saved.tensors.end(),
                     [](const SavedTensor& t) { return WithoutChainedPrefix(t.key).second >= 0; });
}

// The model's keys (NameTensors, TorchtitanTensors); `chained` as NameTensors'.
Result<std::vector<Tensor>> ModelKeys(const ModelSpec& spec, Keys keys, bool chained,
                                      const std::string& metadata_path) {
  if (keys == Keys::kTorchtitan) {
    PTC_ASSIGN_OR_RETURN(std::vector<Tensor> model, TorchtitanTensors(spec), metadata_path);
    return model;
  }
  PTC_ASSIGN_OR_RETURN(std::vector<GlobalTensor> globals, GlobalTensors(spec));
  std::vector<TensorRecord> records;
  for (const GlobalTensor& g : globals) records.push_back(TensorRecord{g.name, g.dtype, g.shape});
  return NameTensors(records, keys, chained);
}

// A save of Megatron-Core's TE spec keys an MoE layer's norm as
// "decoder.layers.pre_mlp_layernorm.*" (TeSpecNormKey): the model's tensors
// take those keys when the save has them and not the local spec's; a save
// with both (a torch_dist tree ptcfs rendered) is read by the local spec's,
// the other passed over (`saved` without them).
void TakeTeSpecNormKeys(std::vector<Tensor>* model, SavedCheckpoint* saved) {
  std::set<std::string> keys;
  for (const SavedTensor& t : saved->tensors) keys.insert(t.key);
  std::set<std::string> te;
  bool local = false;
  for (const Tensor& t : *model) {
    std::string key = TeSpecNormKey(t);
    if (key.empty() || keys.count(key) == 0) continue;
    local = local || keys.count(t.key) != 0;
    te.insert(std::move(key));
  }
  if (te.empty()) return;
  if (local) {
    std::erase_if(saved->tensors, [&](const SavedTensor& t) { return te.count(t.key) != 0; });
    return;
  }
  for (Tensor& t : *model) {
    std::string key = TeSpecNormKey(t);
    if (key.empty()) continue;
    t.key = key;
    t.path = {std::move(key)};
  }
}

// The place of a stacked key's tensor among its key's: its layer, or (layer,
// expert) row-major for a routed expert's (Megatron-Core's).
size_t StackSlot(const Tensor& t) {
  return static_cast<size_t>(t.expert >= 0 ? t.layer * t.experts + t.expert : t.layer);
}

// The first tensor of a key (a mixture-of-experts model's stacked keys have
// none at the layers of the other kind).
const Tensor& FrontOf(const std::vector<const Tensor*>& tensors) {
  for (const Tensor* t : tensors) {
    if (t != nullptr) return *t;
  }
  return *tensors.front();  // MatchKeys puts one in every list
}

// The model key whose optimizer state `key` would be (optim.state.P.K with
// kTorch, optimizer.state.P.K with kTorchtitan, [chained_N.]optimizer.state.K.P
// with kMegatronCore), when the model has that key; else empty. A save's key
// of that form that the model lacks is the state of a buffer (HasOptimizerState).
std::string StateOfModelKey(const std::string& key, Keys keys,
                            const std::map<std::string, std::vector<const Tensor*>>& model) {
  constexpr const char* kKinds[] = {"exp_avg_sq", "exp_avg", "fp32", "fp32_param"};
  std::string_view k = keys == Keys::kMegatronCore ? WithoutChainedPrefix(key).first : std::string_view(key);
  const std::string_view prefix = keys == Keys::kTorch ? "optim.state." : "optimizer.state.";
  if (!k.starts_with(prefix)) return "";
  k.remove_prefix(prefix.size());
  for (std::string_view kind : kKinds) {
    std::string stem;
    if (keys == Keys::kMegatronCore && k.starts_with(kind) && k.substr(kind.size()).starts_with(".")) {
      stem = std::string(k.substr(kind.size() + 1));
    } else if (keys != Keys::kMegatronCore && k.ends_with(kind) && k.size() > kind.size() &&
               k[k.size() - kind.size() - 1] == '.') {
      stem = (keys == Keys::kTorch ? "model." : "") + std::string(k.substr(0, k.size() - kind.size() - 1));
    }
    if (!stem.empty() && model.count(stem) != 0) return stem;
  }
  return "";
}

// The model's keys matched with the save's.
struct KeyMatch {
  // Each key's global tensors (by StackSlot when stacked; null at a slot the key has no tensor).
  std::map<std::string, std::vector<const Tensor*>> tensors;
  std::vector<std::string> order;                             // the model's
  std::map<std::string, const SavedTensor*> saved;
};

// Every key of the save is one of the model's (or passed over), and every
// key of the model is saved whole, with its dtype and shape.
// \error InvalidArgument naming the key at fault.
Result<KeyMatch> MatchKeys(const std::vector<Tensor>& model, const SavedCheckpoint& saved, Keys keys,
                           const std::string& metadata_path) {
  KeyMatch m;
  for (const Tensor& t : model) {
    if (m.tensors.count(t.key) == 0) m.order.push_back(t.key);
    auto& list = m.tensors[t.key];
    if (t.layer >= 0 && StackSlot(t) >= list.size()) list.resize(StackSlot(t) + 1);
    if (t.layer >= 0) {
      list[StackSlot(t)] = &t;
    } else {
      list.push_back(&t);
    }
  }
  for (const SavedTensor& t : saved.tensors) {
    if (m.tensors.count(t.key) == 0) {
      if (PassedOver(t.key, keys)) continue;
      if (const std::string of = StateOfModelKey(t.key, keys, m.tensors); !of.empty()) {
        return Bad(metadata_path, "key " + t.key + ": optimizer state of " + FrontOf(m.tensors.at(of)).name +
                                      ", a buffer (its schema rule is marked \"buffer\"), which has none: "
                                      "buffers are no parameters of the optimizer (docs/schema_format.md)");
      }
      const std::string name = keys == Keys::kTorch ? TensorOfKey(t.key) : "";
      if (!name.empty()) return Bad(metadata_path, "key " + t.key + ": the model has no tensor " + name);
      return Bad(metadata_path, "key " + t.key + " names no tensor ptcfs keeps (docs/dcp_format.md, Keys)");
    }
    m.saved[t.key] = &t;
  }
  for (const std::string& key : m.order) {
    const std::vector<const Tensor*>& list = m.tensors.at(key);
    const Tensor& front = FrontOf(list);
    auto it = m.saved.find(key);
    if (it == m.saved.end()) {
      return Bad(metadata_path, "the checkpoint lacks the model's tensor " + front.name + " (key " + key + ")");
    }
    const SavedTensor& t = *it->second;
    const Shape shape = KeyShape(front);
    if (t.dtype != front.dtype || t.shape != shape) {
      return Bad(metadata_path, "key " + t.key + " is " + std::string(DTypeName(t.dtype)) + " " +
                                    ShapeToString(t.shape) + ", the model's is " + std::string(DTypeName(front.dtype)) +
                                    " " + ShapeToString(shape));
    }
    PTC_RETURN_IF_ERROR(CheckChunksDisjoint(t, metadata_path));
    Index volume = 0, held = 0;  // what the chunks hold, what the model's tensors of the key do
    for (const SavedChunk& c : t.chunks) volume += c.box.volume();
    for (const Tensor* g : list) held += g == nullptr ? 0 : NumElements(g->shape);
    if (volume != held) {
      return Bad(metadata_path, "key " + t.key + ": the chunks hold " + std::to_string(volume) + " of its " +
                                    std::to_string(held) + " elements");
    }
  }
  return m;
}

// The checkpoint's files a source reads, each opened once (DcpSource::files).
class SourceFiles {
 public:
  SourceFiles(Env* env, std::string dir, DcpSource* source) : env_(env), dir_(std::move(dir)), source_(source) {}
  // Whether the directory holds `name` (a part's other files are other workers').
  bool Exists(const std::string& name) const { return env_->Exists(JoinPath(dir_, name)); }
  bool Opened(const std::string& name) const { return index_.count(name) != 0; }
  // The index of `name` in source->files, opened on first use.
  // \error as Env::OpenRead, in the context `what` (none when empty).
  Result<size_t> Open(const std::string& name, const std::string& what) {
    auto [it, inserted] = index_.try_emplace(name, source_->files.size());
    if (inserted) {
      auto f = env_->OpenRead(JoinPath(dir_, name));
      if (!f.ok()) {
        index_.erase(it);
        return what.empty() ? f.status() : f.status().WithContext(what);
      }
      source_->files.push_back(std::move(f).value());
      source_->file_names.push_back(name);
    }
    return it->second;
  }

 private:
  Env* env_;
  std::string dir_;
  DcpSource* source_;
  std::map<std::string, size_t> index_;
};

// Where the tensor bytes of chunk `c` of `t` in `f` begin, after its torch.save record is checked.
// \error InvalidArgument naming the chunk (`what`).
Result<uint64_t> TensorBytesAt(const SavedTensor& t, const SavedChunk& c, const RandomAccessFile& f,
                               const std::string& what) {
  if (c.offset > f.Size() || c.length > f.Size() - c.offset) {
    return Bad(what, "lies past the end of the file (" + std::to_string(f.Size()) + " bytes)");
  }
  FileRange range(f, c.offset, c.length, what);
  PTC_ASSIGN_OR_RETURN(TorchFile tf, ReadTorchFile(range, what));
  if (!tf.root.is_tensor()) return Bad(what, "holds a " + std::string(KindName(tf.root.kind())) + ", not a tensor");
  const pickle::Tensor& tensor = tf.root.tensor();
  if (tensor.dtype != t.dtype || tensor.shape != c.box.shape() || !IsContiguous(tensor)) {
    return Bad(what, "holds a " + std::string(DTypeName(tensor.dtype)) + " tensor of shape " +
                         ShapeToString(tensor.shape) + (IsContiguous(tensor) ? "" : ", not contiguous") +
                         "; the chunk is " + std::string(DTypeName(t.dtype)) + " " + ShapeToString(c.box.shape()));
  }
  const TorchStorage* storage = tf.FindStorage(tensor.storage_key);
  if (storage == nullptr) return Bad(what, "has no storage " + tensor.storage_key);
  return c.offset + storage->member.data_offset + static_cast<uint64_t>(tensor.storage_offset) * DTypeSize(t.dtype);
}

// The pieces of chunk `c` of `t` (the model's `tensors` of its key) in file
// `file` of `source`, after its torch.save record is checked: one piece,
// or one per layer a chunk of a stacked key spans (each a contiguous run of it).
// \error InvalidArgument naming the chunk (`what`).
Status AddChunk(const SavedTensor& t, const SavedChunk& c, const std::vector<const Tensor*>& tensors, size_t file,
                const std::string& what, DcpSource* source) {
  PTC_ASSIGN_OR_RETURN(const uint64_t at, TensorBytesAt(t, c, *source->files[file], what));
  const Tensor& front = FrontOf(tensors);
  if (!front.blocks.empty() && front.layer < 0) {  // a chunk of a key whose rows are blocks of the global tensor's
    AddBlockChunks(front, c.box, file, at, &source->chunks);
    return Status::OK();
  }
  if (front.layer < 0) {
    const uint64_t size = static_cast<uint64_t>(c.box.volume()) * DTypeSize(t.dtype);
    source->chunks.push_back(DcpSource::Chunk{front.name, t.dtype, c.box, file, at, size});
    return Status::OK();
  }
  // The stacked dims: the layers, and a routed expert's experts (Megatron-Core's).
  const size_t stacked = front.expert >= 0 ? 2 : 1;
  const Box slice{std::vector<Index>(c.box.begin.begin() + stacked, c.box.begin.end()),
                  std::vector<Index>(c.box.end.begin() + stacked, c.box.end.end())};
  const uint64_t size = static_cast<uint64_t>(slice.volume()) * DTypeSize(t.dtype);
  const Index e0 = stacked == 2 ? c.box.begin[1] : 0, e1 = stacked == 2 ? c.box.end[1] : 1;
  uint64_t offset = at;  // each slice a contiguous run of the chunk
  for (Index layer = c.box.begin[0]; layer < c.box.end[0]; ++layer) {
    for (Index e = e0; e < e1; ++e, offset += size) {
      const size_t slot = static_cast<size_t>(stacked == 2 ? layer * front.experts + e : layer);
      const Tensor* g = slot < tensors.size() ? tensors[slot] : nullptr;
      if (g == nullptr) {
        return Bad(what, "holds layer " + std::to_string(layer) +
                             (stacked == 2 ? ", expert " + std::to_string(e) : std::string()) +
                             ", which has no tensor of the key");
      }
      if (!g->blocks.empty()) {  // torchtitan's experts: each slice rows of its global tensor
        AddBlockChunks(*g, slice, file, offset, &source->chunks);
        continue;
      }
      source->chunks.push_back(DcpSource::Chunk{g->name, t.dtype, slice, file, offset, size});
    }
  }
  return Status::OK();
}

// The index in source->files of the file of chunk `c` of `t`, opened; nullopt
// for a part whose directory lacks it (another worker's).
// \error as SourceFiles::Open.
Result<std::optional<size_t>> ChunkFile(const SavedTensor& t, const SavedChunk& c, bool part,
                                        const std::string& metadata_path, SourceFiles& files, DcpSource* source) {
  if (part && !files.Opened(c.file)) {
    source->all_files.insert(c.file);
    if (!files.Exists(c.file)) return std::nullopt;
  }
  PTC_ASSIGN_OR_RETURN(const size_t index, files.Open(c.file, metadata_path + ": " + ChunkName(t, c)));
  return std::optional(index);
}

// Every chunk's piece(s), before the store is touched. A part reads the
// files this worker holds (the others are other workers').
Status AddChunks(const KeyMatch& keys, bool part, const std::string& dir, const std::string& metadata_path,
                 SourceFiles& files, DcpSource* source) {
  for (const std::string& key : keys.order) {
    const SavedTensor& t = *keys.saved.at(key);
    for (const SavedChunk& c : t.chunks) {
      if (c.box.volume() == 0) continue;  // holds nothing: nothing to read or store
      PTC_ASSIGN_OR_RETURN(const std::optional<size_t> file, ChunkFile(t, c, part, metadata_path, files, source));
      if (!file) continue;
      PTC_RETURN_IF_ERROR(AddChunk(t, c, keys.tensors.at(key), *file, dir + ": " + ChunkName(t, c), source));
    }
  }
  return Status::OK();
}

// The DistributedOptimizer's bucket states of a torch_dist save (dist_optimizer_read.h), taken
// out of `saved`; when there are any, the model's optimizer keys are not asked for (`model` without them).
std::vector<SavedTensor> TakeBucketKeys(SavedCheckpoint* saved, std::vector<Tensor>* model) {
  auto first = std::stable_partition(saved->tensors.begin(), saved->tensors.end(),
                                     [](const SavedTensor& t) { return !DistributedOptimizerKey(t.key); });
  std::vector<SavedTensor> buckets(std::make_move_iterator(first), std::make_move_iterator(saved->tensors.end()));
  saved->tensors.erase(first, saved->tensors.end());
  if (buckets.empty()) return buckets;
  std::erase_if(*model, [](const Tensor& t) {
    return WithoutChainedPrefix(t.key).first.starts_with(OptimizerPrefix(Keys::kMegatronCore));
  });
  return buckets;
}

// The pieces of the bucket states `buckets` of the DistributedOptimizer's dp_reshardable form,
// read in source->layout's config in the registration order of `names`.
// \error as LayOutDpReshardable and AddBucketChunks.
Status AddDistributedOptimizerChunks(const std::vector<SavedTensor>& buckets, megatron::NameSet names, bool part,
                                     const std::string& dir, const std::string& metadata_path, SourceFiles& files,
                                     DcpSource* source) {
  const std::string config =
      "config " + source->layout.config().ToString() + " in " + std::string(megatron::NameSetName(names)) + " names";
  PTC_ASSIGN_OR_RETURN(const megatron::DpReshardableLayout layout, megatron::LayOutDpReshardable(source->layout, names),
                       metadata_path + ": the distributed optimizer's dp_reshardable save in " + config);
  auto bytes = [&](const SavedTensor& t, const SavedChunk& c) -> Result<std::optional<std::pair<size_t, uint64_t>>> {
    PTC_ASSIGN_OR_RETURN(const std::optional<size_t> file, ChunkFile(t, c, part, metadata_path, files, source));
    if (!file) return std::nullopt;
    PTC_ASSIGN_OR_RETURN(const uint64_t at, TensorBytesAt(t, c, *source->files[*file], dir + ": " + ChunkName(t, c)));
    return std::make_pair(*file, at);
  };
  return AddBucketChunks(buckets, layout, config, bytes, metadata_path, source);
}

// A part's Adam steps and groups and carried entries in this worker's files,
// which PartsOptimizer reads with the other parts' (the entries may be in any
// rank's file).
Status ReadOptimizerPart(const SavedCheckpoint& saved, std::vector<Tensor> model, Keys keys,
                         const std::string& metadata_path, SourceFiles& files, DcpSource* source) {
  OptimizerPart& optimizer = source->optimizer_part.emplace();
  auto carry = [&](const std::string& key, const std::string& file, uint64_t offset, uint64_t length) -> Status {
    if (file.empty()) return Status::OK();  // SavedOptimizer names it
    source->all_files.insert(file);
    if (!files.Exists(file)) return Status::OK();  // another worker's
    const std::string where = metadata_path + ": key " + key + " (" + file + " bytes " + std::to_string(offset) +
                              "+" + std::to_string(length) + ")";
    PTC_ASSIGN_OR_RETURN(size_t index, files.Open(file, where));
    const RandomAccessFile& f = *source->files[index];
    if (offset > f.Size() || length > f.Size() - offset) return Bad(where, "lies past the end of the file");
    if (length > kMaxTorchPickleSize) {
      return Bad(where, "is larger than " + std::to_string(kMaxTorchPickleSize) + " bytes");
    }
    std::string bytes(length, '\0');
    PTC_RETURN_IF_ERROR(f.Read(offset, bytes.size(), bytes.data()), where);
    optimizer.entries.push_back(EntryBytes{file, f.Size(), offset, std::move(bytes)});
    return Status::OK();
  };
  std::set<std::string> model_keys;  // a key of the model is its tensor, not carried
  for (const Tensor& t : model) model_keys.insert(t.key);
  for (const SavedTensor& t : saved.tensors) {
    if (!OptimizerEntryKey(t.key) && (!CarriedTensorKey(t.key, keys) || model_keys.count(t.key) != 0)) continue;
    for (const SavedChunk& c : t.chunks) PTC_RETURN_IF_ERROR(carry(t.key, c.file, c.offset, c.length));
  }
  for (const SavedBytes& b : saved.bytes) {
    if (OptimizerEntryKey(b.key) || CarriedObjectKey(b.key, keys)) {
      PTC_RETURN_IF_ERROR(carry(b.key, b.file, b.offset, b.length));
    }
  }
  optimizer.saved = std::make_shared<const SavedCheckpoint>(saved);
  optimizer.model = std::move(model);
  optimizer.keys = keys;
  return Status::OK();
}

// torchtitan's fp32 masters are its (float32) parameters: each parameter's
// chunks again, as the store's `.fp32` tensor.
void AddTorchtitanMasters(const std::vector<Tensor>& model, Keys keys, DcpSource* source) {
  constexpr std::string_view kState = ".exp_avg";
  std::set<std::string> params;  // those with optimizer state (no buffer: expert_bias_E of a marked schema)
  for (const Tensor& t : model) {
    if (t.key.starts_with(OptimizerPrefix(keys)) && t.name.ends_with(kState)) {
      params.insert(t.name.substr(0, t.name.size() - kState.size()));
    }
  }
  std::vector<DcpSource::Chunk> masters;
  for (const DcpSource::Chunk& c : source->chunks) {
    if (params.count(c.tensor) != 0) {
      masters.push_back(c);
      masters.back().tensor += ".fp32";
    }
  }
  source->chunks.insert(source->chunks.end(), masters.begin(), masters.end());
}

}  // namespace

Result<DcpSource> OpenDcpPart(Env* env, const std::string& dir, std::string_view metadata, const Schema& schema,
                              const ModelDims& dims, const ParallelConfig& config, Keys keys, bool part,
                              megatron::NameSet names) {
  const std::string metadata_path = JoinPath(dir, kMetadataFile);
  PTC_ASSIGN_OR_RETURN(SavedCheckpoint saved, ParseMetadata(metadata, metadata_path));
  keys = SavedKeys(saved, keys);
  PTC_ASSIGN_OR_RETURN(const ModelSpec spec, SavedSpec(saved, schema, dims, keys, metadata_path));
  PTC_ASSIGN_OR_RETURN(ModelLayout layout, ModelLayout::Make(spec, config));
  PTC_ASSIGN_OR_RETURN(std::vector<Tensor> model, ModelKeys(spec, keys, ChainedSave(saved, keys), metadata_path));
  std::vector<SavedTensor> buckets;  // the distributed optimizer's state
  if (keys == Keys::kMegatronCore) {
    TakeTeSpecNormKeys(&model, &saved);
    buckets = TakeBucketKeys(&saved, &model);
  }
  PTC_ASSIGN_OR_RETURN(const KeyMatch matched, MatchKeys(model, saved, keys, metadata_path));

  DcpSource source{std::move(layout), {}, {}, {}, {}};
  SourceFiles files(env, dir, &source);
  PTC_RETURN_IF_ERROR(AddChunks(matched, part, dir, metadata_path, files, &source));
  if (!buckets.empty()) {
    PTC_RETURN_IF_ERROR(AddDistributedOptimizerChunks(buckets, names, part, dir, metadata_path, files, &source));
  }
  if (part && keys != Keys::kMegatronCore) {
    PTC_RETURN_IF_ERROR(ReadOptimizerPart(saved, model, keys, metadata_path, files, &source));
  }
  if (!part && keys != Keys::kMegatronCore) {  // Adam's steps and the groups (a part's may be elsewhere)
    auto open = [&](const std::string& name) -> Result<const RandomAccessFile*> {
      PTC_ASSIGN_OR_RETURN(size_t index, files.Open(name, ""));
      return source.files[index].get();
    };
    PTC_ASSIGN_OR_RETURN(source.optimizer, SavedOptimizer(saved, model, keys, open, metadata_path));
    PTC_ASSIGN_OR_RETURN(source.entries, SavedEntries(saved, model, keys, open, metadata_path));
  }
  if (keys == Keys::kTorchtitan && spec.optimizer) AddTorchtitanMasters(model, keys, &source);
  return source;
}

Status WriteDcpChunks(GenerationWriter& writer, const DcpSource& source, int worker, ImportResult* result,
                      const ProgressFn& progress) {
  std::vector<char> buf(kCopyBytes);
  for (const DcpSource::Chunk& c : source.chunks) {
    const std::string what = "tensor " + c.tensor;
    if (c.woven.empty()) {
      PTC_RETURN_IF_ERROR(WritePiece(writer, c.tensor, c.dtype, {c.box}, worker, *source.files[c.file], c.offset,
                                     c.size, buf, progress, what));
    } else {  // rows woven in the file, stored box by box
      std::vector<char> in(c.size), dense(c.size);
      PTC_RETURN_IF_ERROR(source.files[c.file]->Read(c.offset, c.size, in.data()), what);
      std::vector<Box> boxes;
      Index at = 0;
      for (const Segment& s : c.woven) {
        const Layout to = DenseLayout(s.box, at);
        CopyRegion(s.box, in.data(), s.box, s.layout, dense.data(), s.box, to, DTypeSize(c.dtype));
        at += s.box.volume();
        boxes.push_back(s.box);
      }
      PTC_ASSIGN_OR_RETURN(auto sink, writer.NewShard(c.tensor, c.dtype, std::move(boxes), worker));
      PTC_RETURN_IF_ERROR(sink->Append(dense.data(), dense.size()));
      PTC_ASSIGN_OR_RETURN(ShardRecord record, sink->Finish());
      writer.AddShard(std::move(record));
      if (progress) progress(c.size);
    }
    ++result->shards;
    result->bytes_stored += c.size;
    result->bytes_read += c.size;
  }
  return Status::OK();
}

Result<ImportResult> WriteDcp(Store* store, const DcpSource& source, nlohmann::json extra, const std::string& save_name,
                              const ProgressFn& progress) {
  SetSavedEntries(source.entries, save_name, &extra);  // the save's other entries take the place of any before
  if (source.optimizer) {                              // the save's steps and groups take the place of the store's
    PTC_ASSIGN_OR_RETURN(megatron::MegatronState state, megatron::LoadMegatronState(extra, "the store's manifest"));
    state.optimizer = *source.optimizer;
    extra[std::string(megatron::kManifestKey)] = megatron::EncodeMegatronState(state);
  }
  PTC_ASSIGN_OR_RETURN(auto writer, store->BeginGeneration());
  ImportResult result;
  PTC_RETURN_IF_ERROR(WriteDcpChunks(*writer, source, source.layout.config().WorkerOf(0), &result, progress));
  GenerationManifest meta;
  meta.extra = std::move(extra);
  PTC_RETURN_IF_ERROR(DescribeModel(source.layout.spec(), source.layout.config(), &meta));
  PTC_RETURN_IF_ERROR(writer->Commit(std::move(meta)));
  result.generation = writer->generation();
  return result;
}

Result<ImportResult> ImportDcp(Env* env, const std::string& dir, const std::string& store_path, const Schema& schema,
                               const ModelDims& dims, const ParallelConfig& config, const ProgressFn& progress) {
  PTC_ASSIGN_OR_RETURN(const DcpSource source, OpenDcp(env, dir, schema, dims, config, Keys::kTorch));
  return ImportWith(env, store_path, [&](Store* store) {
    return WriteDcp(store, source, store->has_generation() ? store->current().extra : nlohmann::json::object(),
                    /*save_name=*/"", progress);
  });
}

}  // namespace ptc::dcp
