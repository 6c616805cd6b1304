#include "ptc/checkpoint/hf/read.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "ptc/base/json_fields.h"
#include "ptc/checkpoint/hf/hf.h"
#include "ptc/format/safetensors.h"
#include "ptc/model/view.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/model_spec.h"

namespace ptc::hf {
namespace {

constexpr size_t kCopyBytes = 4 << 20;

Status Bad(const std::string& where, const std::string& what) { return InvalidArgumentError(where + ": " + what); }

bool PlainName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// A JSON file of the checkpoint, a key twice refused (JSON parsers keep the last one).
Result<nlohmann::json> ReadJson(Env* env, const std::string& path) {
  PTC_ASSIGN_OR_RETURN(auto file, env->OpenRead(path));
  if (file->Size() > kMaxJsonSize) return Bad(path, "larger than " + std::to_string(kMaxJsonSize) + " bytes");
  std::string text(file->Size(), '\0');
  PTC_RETURN_IF_ERROR(file->Read(0, text.size(), text.data()));
  std::string duplicate;
  nlohmann::json j = ParseJsonUniqueKeys(text, &duplicate);
  if (!duplicate.empty()) return Bad(path, "names \"" + duplicate + "\" twice");
  if (j.is_discarded()) return Bad(path, "is not JSON");
  return j;
}

// tensor -> shard file, from the index's weight_map.
Result<std::map<std::string, std::string>> WeightMap(const nlohmann::json& index, const std::string& path) {
  if (!index.is_object()) return Bad(path, "is not a JSON object");
  auto it = index.find("weight_map");
  if (it == index.end() || !it->is_object()) return Bad(path, "has no \"weight_map\" object");
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : it->items()) {
    if (!file.is_string()) return Bad(path, "tensor " + tensor + ": its shard is not a file name");
    const std::string name = file.get<std::string>();
    if (!PlainName(name))
      return Bad(path, "tensor " + tensor + ": shard '" + name + "' is not a file name of the directory");
    out[tensor] = name;
  }
  if (out.empty()) return Bad(path, "names no tensor");
  return out;
}

// The shards: model.safetensors alone, or those the index names. A directory
// with both is read as transformers' from_pretrained reads it: the single
// file (the index is then not read at all).
struct ShardList {
  std::optional<std::map<std::string, std::string>> weight_map;  // the index's
  std::vector<std::string> names;
};

Result<ShardList> ListShards(Env* env, const std::string& dir) {
  const std::string index_path = JoinPath(dir, kIndexFile);
  ShardList out;
  if (env->Exists(JoinPath(dir, kSingleFile))) {
    out.names = {kSingleFile};
    return out;
  }
  if (!env->Exists(index_path)) {
    return NotFoundError(dir + ": neither " + std::string(kIndexFile) + " nor " + kSingleFile +
                         " (a model save_pretrained wrote)");
  }
  PTC_ASSIGN_OR_RETURN(nlohmann::json index, ReadJson(env, index_path));
  PTC_ASSIGN_OR_RETURN(out.weight_map, WeightMap(index, index_path));
  for (const auto& [tensor, file] : *out.weight_map) {
    if (std::find(out.names.begin(), out.names.end(), file) == out.names.end()) out.names.push_back(file);
  }
  std::sort(out.names.begin(), out.names.end());
  return out;
}

// Every shard's header, its file open: each tensor in one shard, the one the index names.
struct ShardHeaders {
  struct Found {
    size_t file;
    SafetensorsEntry entry;
  };
  std::map<std::string, Found> found;  // by tensor
  std::vector<std::string> file_names;
  std::vector<std::unique_ptr<RandomAccessFile>> files;
};

Result<ShardHeaders> ReadShards(Env* env, const std::string& dir, const ShardList& shards) {
  const auto& weight_map = shards.weight_map;
  ShardHeaders out;
  for (const std::string& name : shards.names) {
    const std::string path = JoinPath(dir, name);
    if (weight_map && !env->Exists(path)) {
      std::string some;
      for (const auto& [tensor, file] : *weight_map) {
        if (file == name) some = tensor;
      }
      return NotFoundError(path + ": missing; " + std::string(kIndexFile) + " puts " + some + " there");
    }
    PTC_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(env, path));
    PTC_ASSIGN_OR_RETURN(auto file, env->OpenRead(path));
    if (file->Size() != header.file_size) return Bad(path, "changed while it was read");
    for (const SafetensorsEntry& e : header.tensors) {
      if (weight_map) {
        auto w = weight_map->find(e.name);
        if (w == weight_map->end())
          return Bad(path, "holds tensor " + e.name + ", which " + kIndexFile + " does not name");
        if (w->second != name) {
          return Bad(path, "holds tensor " + e.name + ", which " + kIndexFile + " puts in " + w->second);
        }
      }
      auto [it, inserted] = out.found.try_emplace(e.name, ShardHeaders::Found{out.files.size(), e});
      if (!inserted) {
        return Bad(path, "holds tensor " + e.name + ", which " + out.file_names[it->second.file] + " holds too");
      }
    }
    out.file_names.push_back(name);
    out.files.push_back(std::move(file));
  }
  if (weight_map) {
    for (const auto& [tensor, file] : *weight_map) {
      if (!out.found.count(tensor))
        return Bad(JoinPath(dir, file), "lacks tensor " + tensor + ", which the index puts there");
    }
  }
  return out;
}

// The model config.json describes, in the tensors' dtype, no optimizer state.
// \error InvalidArgument naming a tensor of another dtype than the others.
Result<ModelSpec> HfSpec(ConfigModel described, const ShardHeaders& shards, const std::string& dir) {
  ModelSpec spec;
  spec.schema = std::move(described.schema);
  spec.dims = described.dims;
  std::optional<std::pair<std::string, DType>> first;
  for (const auto& [name, f] : shards.found) {
    if (first && f.entry.dtype != first->second) {
      return Bad(JoinPath(dir, shards.file_names[f.file]),
                 "tensor " + name + " is " + std::string(DTypeName(f.entry.dtype)) + " but " + first->first + " is " +
                     std::string(DTypeName(first->second)) + " (ptcfs keeps a model's parameters in one dtype)");
    }
    if (!first) first = std::make_pair(name, f.entry.dtype);
  }
  if (first) spec.dtype = first->second;
  return spec;
}

// Each tensor of `model` as one piece of a shard; a shard's tensor the model
// lacks, or of another shape, is refused naming it.
Result<std::vector<HfSource::Piece>> MatchTensors(const Model& model, const ShardHeaders& shards,
                                                  const std::string& schema, const std::string& dir) {
  std::map<std::string, const LocalTensor*> wanted;
  for (const LocalTensor& t : model.tensors) wanted[t.name] = &t;
  const std::string arch = ArchName(model.arch);
  for (const auto& [name, f] : shards.found) {
    const std::string where = JoinPath(dir, shards.file_names[f.file]);
    auto it = wanted.find(name);
    if (it == wanted.end()) {
      if (name == "lm_head.weight" && model.tied) {
        return Bad(where,
                   "tensor lm_head.weight: config.json ties the output layer to the embedding "
                   "(tie_word_embeddings), so the model has no tensor of its own for it");
      }
      return Bad(where, "tensor " + name + ": " + arch + " as ptcfs maps it (schema " + schema +
                            ") has no such tensor (docs/hf_format.md)");
    }
    if (f.entry.shape != it->second->shape) {
      return Bad(where, "tensor " + name + " is " + ShapeToString(f.entry.shape) + "; " + kConfigFile + " gives it " +
                            ShapeToString(it->second->shape));
    }
  }
  std::vector<HfSource::Piece> pieces;
  for (const LocalTensor& t : model.tensors) {
    auto it = shards.found.find(t.name);
    if (it == shards.found.end()) return Bad(dir, "the checkpoint lacks tensor " + t.name + " of " + arch);
    const std::vector<ShardKey> keys = StoredShards(t);
    if (keys.size() != 1) return InternalError(t.name + ": cut from " + std::to_string(keys.size()) + " tensors");
    pieces.push_back(HfSource::Piece{t.name, keys[0].tensor, t.dtype, keys[0].boxes, it->second.file,
                                     it->second.entry.offset, it->second.entry.nbytes});
  }
  return pieces;
}

}  // namespace

Result<HfSource> OpenHf(Env* env, const std::string& dir, const ParallelConfig& config) {
  const std::string config_path = JoinPath(dir, kConfigFile);
  PTC_ASSIGN_OR_RETURN(nlohmann::json config_json, ReadJson(env, config_path));
  PTC_ASSIGN_OR_RETURN(ConfigModel described, ModelOfConfig(config_json, config_path));
  PTC_ASSIGN_OR_RETURN(const ShardList list, ListShards(env, dir));
  PTC_ASSIGN_OR_RETURN(ShardHeaders shards, ReadShards(env, dir, list));
  PTC_ASSIGN_OR_RETURN(ModelSpec spec, HfSpec(std::move(described), shards, dir));
  PTC_ASSIGN_OR_RETURN(const Model model, MapModel(spec), config_path);
  PTC_ASSIGN_OR_RETURN(std::vector<HfSource::Piece> pieces, MatchTensors(model, shards, spec.schema.name, dir));
  PTC_ASSIGN_OR_RETURN(ModelLayout layout, ModelLayout::Make(std::move(spec), config));
  return HfSource{std::move(layout), std::move(config_json), std::move(shards.file_names), std::move(shards.files),
                  std::move(pieces)};
}

Result<ImportResult> WriteHf(Store* store, const HfSource& source, nlohmann::json extra, const ProgressFn& progress) {
  PTC_ASSIGN_OR_RETURN(auto writer, store->BeginGeneration());
  ImportResult result;
  const int worker = source.layout.config().WorkerOf(0);
  std::vector<char> buf(kCopyBytes);
  for (const HfSource::Piece& p : source.pieces) {
    PTC_RETURN_IF_ERROR(WritePiece(*writer, p.tensor, p.dtype, p.boxes, worker, *source.files[p.file], p.offset, p.size,
                                   buf, progress, "tensor " + p.name + " of " + source.file_names[p.file]));
    ++result.shards;
    result.bytes_stored += p.size;
    result.bytes_read += p.size;
  }
  GenerationManifest meta;
  meta.extra = extra.is_object() ? std::move(extra) : nlohmann::json::object();
  meta.extra["hf"] = {{"config", source.config}};
  PTC_RETURN_IF_ERROR(DescribeModel(source.layout.spec(), source.layout.config(), &meta));
  PTC_RETURN_IF_ERROR(writer->Commit(std::move(meta)));
  result.generation = writer->generation();
  return result;
}

Result<ImportResult> ImportHf(Env* env, const std::string& dir, const std::string& store_path,
                              const ParallelConfig& config, const ProgressFn& progress) {
  PTC_ASSIGN_OR_RETURN(const HfSource source, OpenHf(env, dir, config));
  return ImportWith(env, store_path, [&](Store* store) {
    return WriteHf(store, source, store->has_generation() ? store->current().extra : nlohmann::json::object(),
                   progress);
  });
}

}  // namespace ptc::hf
