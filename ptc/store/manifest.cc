// Generation manifest JSON. Decoding never throws: the text is parsed with
// allow_exceptions=false and every access checks the type first.
#include "ptc/store/manifest.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "ptc/base/checksum.h"
#include "ptc/base/json_fields.h"
#include "ptc/model/tensor_name.h"
#include "ptc/store/store_layout.h"

namespace ptc {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kFormat = "ptcfs-generation";
constexpr int kVersion = 1;

ordered_json BoxesToOrdered(const std::vector<Box>& boxes) {
  ordered_json out = ordered_json::array();
  for (const Box& b : boxes) out.push_back(ordered_json::array({b.begin, b.end}));
  return out;
}

ordered_json TensorToJson(const TensorRecord& t) {
  ordered_json j;
  j["name"] = t.name;
  j["dtype"] = DTypeName(t.dtype);
  j["shape"] = t.shape;
  return j;
}

ordered_json ShardToJson(const ShardRecord& s) {
  ordered_json j;
  j["tensor"] = s.tensor;
  j["worker"] = s.worker;
  j["boxes"] = BoxesToOrdered(s.boxes);
  j["file"] = s.file;
  j["offset"] = s.offset;
  j["nbytes"] = s.nbytes;
  j["checksum"] = ChecksumToString(s.checksum);
  if (!s.block_checksums.empty()) j["block_checksums"] = BlockChecksumsToString(s.block_checksums);
  if (!s.h5.empty()) j["h5"] = s.h5;
  if (!s.block_crc32s.empty()) j["crc32s"] = BlockCrc32sToString(s.block_crc32s);
  return j;
}

ordered_json CopiesToJson(const RankFileCopies& f) {
  ordered_json j;
  j["file"] = f.file;
  j["worker"] = f.worker;
  j["copies"] = ordered_json::array();
  for (const CopyRecord& c : f.copies) {
    ordered_json x;
    x["tensor"] = c.tensor;
    x["boxes"] = BoxesToOrdered(c.boxes);
    x["offset"] = c.offset;
    j["copies"].push_back(std::move(x));
  }
  return j;
}

Result<std::vector<Index>> DecodeIndexList(const json& j, const std::string& where, std::string_view what) {
  if (!j.is_array()) return CorruptionError(where + ": " + std::string(what) + " must be an array of integers");
  std::vector<Index> out;
  for (const json& x : j) {
    if (!x.is_number_unsigned() || x.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX / 2)) {
      return CorruptionError(where + ": " + std::string(what) + " must hold non-negative integers, got " + x.dump());
    }
    out.push_back(static_cast<Index>(x.get<uint64_t>()));
  }
  return out;
}

Result<TensorRecord> DecodeTensor(const json& j, const std::string& where) {
  if (!j.is_object()) return CorruptionError(where + ": must be an object");
  JsonFields f(j, where);
  TensorRecord t;
  PTC_ASSIGN_OR_RETURN(t.name, f.String("name"));
  if (t.name.empty()) return f.Error("name", "must not be empty");
  if (Status valid = ValidateTensorName(t.name, where); !valid.ok()) return CorruptionError(valid.message());
  const std::string at = where + " ('" + t.name + "')";
  PTC_ASSIGN_OR_RETURN(std::string dtype, f.String("dtype"), at);
  Result<DType> parsed = ParseDType(dtype);
  if (!parsed.ok()) return CorruptionError(at + ": " + parsed.status().message());
  t.dtype = *parsed;
  PTC_ASSIGN_OR_RETURN(const json* shape, f.Get("shape"), at);
  PTC_ASSIGN_OR_RETURN(t.shape, DecodeIndexList(*shape, at, "shape"));
  return t;
}

Result<std::vector<Box>> DecodeBoxes(const json& j, const std::string& where) {
  if (!j.is_array()) return CorruptionError(where + ": \"boxes\" must be an array of [[begin...], [end...]]");
  std::vector<Box> boxes;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string at = where + ": box " + std::to_string(i);
    const json& b = j[i];
    if (!b.is_array() || b.size() != 2) return CorruptionError(at + " must be [[begin...], [end...]]");
    Box box;
    PTC_ASSIGN_OR_RETURN(box.begin, DecodeIndexList(b[0], at, "begin"));
    PTC_ASSIGN_OR_RETURN(box.end, DecodeIndexList(b[1], at, "end"));
    boxes.push_back(std::move(box));
  }
  return boxes;
}

Result<ShardRecord> DecodeShard(const json& j, const std::string& where) {
  if (!j.is_object()) return CorruptionError(where + ": must be an object");
  JsonFields f(j, where);
  ShardRecord s;
  PTC_ASSIGN_OR_RETURN(s.tensor, f.String("tensor"));
  const std::string at = where + " (tensor '" + s.tensor + "')";
  JsonFields g(j, at);
  PTC_ASSIGN_OR_RETURN(uint64_t worker, g.Unsigned("worker"));
  if (worker > 1'000'000) return g.Error("worker", "is out of range");
  s.worker = static_cast<int>(worker);
  PTC_ASSIGN_OR_RETURN(const json* boxes, g.Get("boxes"));
  PTC_ASSIGN_OR_RETURN(s.boxes, DecodeBoxes(*boxes, at));
  PTC_ASSIGN_OR_RETURN(s.file, g.String("file"));
  PTC_ASSIGN_OR_RETURN(s.offset, g.Unsigned("offset"));
  PTC_ASSIGN_OR_RETURN(s.nbytes, g.Unsigned("nbytes"));
  PTC_ASSIGN_OR_RETURN(std::string checksum, g.String("checksum"));
  Result<uint64_t> sum = ParseChecksum(checksum);
  if (!sum.ok()) return CorruptionError(at + ": " + sum.status().message());
  s.checksum = *sum;
  if (const json* blocks = g.Find("block_checksums")) {
    if (!blocks->is_string()) return g.Error("block_checksums", "must be a string");
    Result<std::vector<uint64_t>> parsed = ParseBlockChecksums(blocks->get<std::string>());
    if (!parsed.ok()) return CorruptionError(at + ": " + parsed.status().message());
    s.block_checksums = std::move(parsed).value();
    const uint64_t expect = (s.nbytes + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
    if (s.nbytes <= kChecksumBlockBytes || s.block_checksums.size() != expect) {
      return g.Error("block_checksums", "has " + std::to_string(s.block_checksums.size()) + " blocks; a shard of " +
                                            std::to_string(s.nbytes) + " bytes has " +
                                            (s.nbytes <= kChecksumBlockBytes ? "none" : std::to_string(expect)));
    }
    if (CombineBlockChecksums(s.block_checksums) != s.checksum) {
      return g.Error("block_checksums", "do not hash to the shard checksum " + ChecksumToString(s.checksum));
    }
  }
  if (const json* h5 = g.Find("h5")) {
    if (!h5->is_string() || h5->get<std::string>().empty()) return g.Error("h5", "must be a non-empty string");
    s.h5 = h5->get<std::string>();
  }
  if (const json* crcs = g.Find("crc32s")) {
    if (!crcs->is_string()) return g.Error("crc32s", "must be a string");
    Result<std::vector<uint32_t>> parsed = ParseBlockCrc32s(crcs->get<std::string>());
    if (!parsed.ok()) return CorruptionError(at + ": " + parsed.status().message());
    s.block_crc32s = std::move(parsed).value();
  }
  return s;
}

using PieceKey = std::tuple<int, std::string_view, const std::vector<Box>*>;
struct PieceLess {
  bool operator()(const PieceKey& a, const PieceKey& b) const {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
    if (std::get<1>(a) != std::get<1>(b)) return std::get<1>(a) < std::get<1>(b);
    return *std::get<2>(a) < *std::get<2>(b);
  }
};

// One rank_file_copies entry, checked against the pieces its worker stores.
Result<RankFileCopies> DecodeRankFileCopies(const json& j, const std::string& where,
                                            const std::map<PieceKey, const ShardRecord*, PieceLess>& pieces) {
  if (!j.is_object()) return CorruptionError(where + ": must be an object");
  JsonFields f(j, where);
  RankFileCopies out;
  PTC_ASSIGN_OR_RETURN(out.file, f.String("file"));
  const std::string at = where + " ('" + out.file + "')";
  if (!IsSafeRelativePath(out.file)) {
    return CorruptionError(at + ": file must be a relative path without '.', '..' or empty parts");
  }
  JsonFields g(j, at);
  PTC_ASSIGN_OR_RETURN(uint64_t worker, g.Unsigned("worker"));
  if (worker > 1'000'000) return g.Error("worker", "is out of range");
  out.worker = static_cast<int>(worker);
  PTC_ASSIGN_OR_RETURN(const json* copies, g.Array("copies"));
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [offset, end) of each copy
  for (size_t i = 0; i < copies->size(); ++i) {
    const json& c = (*copies)[i];
    const std::string ci = at + ": copy " + std::to_string(i);
    if (!c.is_object()) return CorruptionError(ci + ": must be an object");
    JsonFields h(c, ci);
    CopyRecord rec;
    PTC_ASSIGN_OR_RETURN(rec.tensor, h.String("tensor"));
    const std::string cw = ci + " (tensor '" + rec.tensor + "')";
    JsonFields k(c, cw);
    PTC_ASSIGN_OR_RETURN(const json* boxes, k.Get("boxes"));
    PTC_ASSIGN_OR_RETURN(rec.boxes, DecodeBoxes(*boxes, cw));
    PTC_ASSIGN_OR_RETURN(rec.offset, k.Unsigned("offset"));
    auto piece = pieces.find(PieceKey{out.worker, rec.tensor, &rec.boxes});
    if (piece == pieces.end()) {
      return CorruptionError(cw + ": worker " + std::to_string(out.worker) + " stores no piece of these boxes");
    }
    uint64_t end = 0;
    if (__builtin_add_overflow(rec.offset, piece->second->nbytes, &end)) return k.Error("offset", "is too large");
    if (piece->second->nbytes > 0) spans.emplace_back(rec.offset, end);
    out.copies.push_back(std::move(rec));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) {
      return CorruptionError(at + ": copies overlap at byte " + std::to_string(spans[i].first));
    }
  }
  return out;
}

Status DecodeCopies(const JsonFields& f, const std::string& label, GenerationManifest& m) {
  const json* list = f.Find("rank_file_copies");
  if (list == nullptr) return Status::OK();  // older manifests, and those without rank files
  if (!list->is_array()) return f.Error("rank_file_copies", "must be an array");
  std::map<PieceKey, const ShardRecord*, PieceLess> pieces;
  for (const ShardRecord& s : m.shards) pieces.emplace(PieceKey{s.worker, s.tensor, &s.boxes}, &s);
  std::set<std::string> files;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string where = label + ": rank_file_copies " + std::to_string(i);
    PTC_ASSIGN_OR_RETURN(RankFileCopies c, DecodeRankFileCopies((*list)[i], where, pieces));
    if (!files.insert(c.file).second) return CorruptionError(where + ": file '" + c.file + "' is listed twice");
    m.rank_file_copies.push_back(std::move(c));
  }
  return Status::OK();
}

Status DecodeHeader(const JsonFields& f, GenerationManifest& m) {
  PTC_ASSIGN_OR_RETURN(std::string format, f.String("format"));
  if (format != kFormat) return f.Error("format", "is '" + format + "', expected '" + std::string(kFormat) + "'");
  PTC_ASSIGN_OR_RETURN(uint64_t version, f.Unsigned("version"));
  if (version != kVersion) return f.Error("version", "is " + std::to_string(version) + "; this build reads version 1");
  PTC_ASSIGN_OR_RETURN(m.generation, f.Unsigned("generation"));
  if (m.generation > kMaxGeneration)
    return f.Error("generation", "is out of range (at most " + std::to_string(kMaxGeneration) + ")");
  if (const json* parent = f.Find("parent"); parent != nullptr && !parent->is_null()) {
    PTC_ASSIGN_OR_RETURN(m.parent, f.Unsigned("parent"));
    if (*m.parent >= m.generation) return f.Error("parent", "must be lower than the generation");
  }
  PTC_ASSIGN_OR_RETURN(m.dims, f.String("dims"));
  PTC_ASSIGN_OR_RETURN(m.config, f.String("config"));
  if (const json* schema = f.Find("schema")) m.schema = *schema;
  if (const json* extra = f.Find("extra")) {
    if (!extra->is_object()) return f.Error("extra", "must be an object");
    m.extra = *extra;
  }
  return Status::OK();
}

Status DecodeBody(const JsonFields& f, const std::string& label, GenerationManifest& m) {
  PTC_ASSIGN_OR_RETURN(const json* tensors, f.Array("tensors"));
  for (size_t i = 0; i < tensors->size(); ++i) {
    PTC_ASSIGN_OR_RETURN(TensorRecord t, DecodeTensor((*tensors)[i], label + ": tensor " + std::to_string(i)));
    m.tensors.push_back(std::move(t));
  }
  std::unordered_map<std::string_view, const TensorRecord*> by_name;  // a model has thousands of shards
  for (const TensorRecord& t : m.tensors) {
    if (!by_name.emplace(t.name, &t).second) {
      return CorruptionError(label + ": tensor '" + t.name + "' is listed twice");
    }
  }
  PTC_ASSIGN_OR_RETURN(const json* shards, f.Array("shards"));
  m.shards.reserve(shards->size());
  for (size_t i = 0; i < shards->size(); ++i) {
    const std::string where = label + ": shard " + std::to_string(i);
    PTC_ASSIGN_OR_RETURN(ShardRecord s, DecodeShard((*shards)[i], where));
    auto found = by_name.find(s.tensor);
    if (found == by_name.end()) return CorruptionError(where + ": unknown tensor '" + s.tensor + "'");
    const TensorRecord* t = found->second;
    Status valid = ValidateShard(s, *t);
    if (!valid.ok()) return CorruptionError(where + ": " + valid.message());
    m.shards.push_back(std::move(s));
  }
  return DecodeCopies(f, label, m);
}

}  // namespace

size_t BlockCount(const ShardRecord& s) { return s.block_checksums.empty() ? 1 : s.block_checksums.size(); }

size_t BlockOf(const ShardRecord& s, uint64_t offset_in_shard) {
  return s.block_checksums.empty() ? 0 : static_cast<size_t>(offset_in_shard / kChecksumBlockBytes);
}

uint64_t BlockBegin(const ShardRecord& s, size_t i) { return s.block_checksums.empty() ? 0 : i * kChecksumBlockBytes; }

uint64_t BlockEnd(const ShardRecord& s, size_t i) {
  return s.block_checksums.empty() ? s.nbytes : std::min<uint64_t>(s.nbytes, (i + 1) * kChecksumBlockBytes);
}

uint64_t BlockChecksum(const ShardRecord& s, size_t i) {
  return s.block_checksums.empty() ? s.checksum : s.block_checksums[i];
}

const TensorRecord* FindTensor(const GenerationManifest& m, std::string_view name) {
  for (const TensorRecord& t : m.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::unordered_map<std::string_view, const TensorRecord*> TensorsByName(const GenerationManifest& m) {
  std::unordered_map<std::string_view, const TensorRecord*> out;
  for (const TensorRecord& t : m.tensors) out.emplace(t.name, &t);
  return out;
}

nlohmann::json BoxesToJson(const std::vector<Box>& boxes) {
  nlohmann::json out = nlohmann::json::array();
  for (const Box& b : boxes) out.push_back(nlohmann::json::array({b.begin, b.end}));
  return out;
}

bool IsSafeRelativePath(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  size_t start = 0;
  while (true) {
    size_t slash = path.find('/', start);
    std::string_view part =
        path.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part.empty() || part == "." || part == ".." || part.find('\0') != std::string_view::npos) return false;
    if (slash == std::string_view::npos) return true;
    start = slash + 1;
  }
}

Status ValidateShard(const ShardRecord& s, const TensorRecord& t) {
  const std::string at = "tensor '" + t.name + "' shape " + ShapeToString(t.shape);
  uint64_t elements = 0;
  for (const Box& b : s.boxes) {
    if (b.begin.size() != t.shape.size() || b.end.size() != t.shape.size()) {
      return InvalidArgumentError(at + ": box of rank " + std::to_string(b.begin.size()) + "/" +
                                  std::to_string(b.end.size()) + ", expected rank " + std::to_string(t.shape.size()));
    }
    uint64_t volume = 1;
    for (size_t d = 0; d < b.rank(); ++d) {
      if (b.begin[d] < 0 || b.begin[d] > b.end[d] || b.end[d] > t.shape[d]) {
        return InvalidArgumentError(at + ": box " + b.ToString() + " lies outside the tensor or has begin > end");
      }
      if (__builtin_mul_overflow(volume, static_cast<uint64_t>(b.end[d] - b.begin[d]), &volume)) {
        return InvalidArgumentError(at + ": box " + b.ToString() + " is too large");
      }
    }
    if (__builtin_add_overflow(elements, volume, &elements)) return InvalidArgumentError(at + ": boxes are too large");
  }
  uint64_t expect = 0;
  if (__builtin_mul_overflow(elements, DTypeSize(t.dtype), &expect))
    return InvalidArgumentError(at + ": boxes are too large");
  if (s.nbytes != expect) {
    return InvalidArgumentError(at + ": nbytes " + std::to_string(s.nbytes) + " != " + std::to_string(elements) +
                                " elements * " + std::to_string(DTypeSize(t.dtype)) + " bytes (" +
                                std::string(DTypeName(t.dtype)) + ")");
  }
  if (s.worker < 0) return InvalidArgumentError(at + ": negative worker " + std::to_string(s.worker));
  if (!IsSafeRelativePath(s.file)) {
    return InvalidArgumentError(at + ": file '" + s.file +
                                "' must be a relative path without '.', '..' or empty parts");
  }
  if (!s.h5.empty() && !IsSafeRelativePath(s.h5)) {
    return InvalidArgumentError(at + ": h5 '" + s.h5 + "' must be a relative path without '.', '..' or empty parts");
  }
  if (!s.block_crc32s.empty() && s.block_crc32s.size() != BlockCount(s)) {
    return InvalidArgumentError(at + ": " + std::to_string(s.block_crc32s.size()) + " block CRC-32s for " +
                                std::to_string(BlockCount(s)) + " checksum blocks");
  }
  return Status::OK();
}

std::string EncodeManifest(const GenerationManifest& m) {
  ordered_json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["generation"] = m.generation;
  j["parent"] = m.parent ? ordered_json(*m.parent) : ordered_json(nullptr);
  j["dims"] = m.dims;
  j["config"] = m.config;
  j["tensors"] = ordered_json::array();
  for (const TensorRecord& t : m.tensors) j["tensors"].push_back(TensorToJson(t));
  j["shards"] = ordered_json::array();
  for (const ShardRecord& s : m.shards) j["shards"].push_back(ShardToJson(s));
  if (!m.rank_file_copies.empty()) {
    j["rank_file_copies"] = ordered_json::array();
    for (const RankFileCopies& f : m.rank_file_copies) j["rank_file_copies"].push_back(CopiesToJson(f));
  }
  j["schema"] = ordered_json(m.schema);
  j["extra"] = ordered_json(m.extra);
  return j.dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

Result<GenerationManifest> DecodeManifest(std::string_view label, std::string_view text) {
  const std::string where(label);
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return CorruptionError(where + ": not valid JSON");
  if (!j.is_object()) return CorruptionError(where + ": must be a JSON object");
  JsonFields f(j, where);
  GenerationManifest m;
  PTC_RETURN_IF_ERROR(DecodeHeader(f, m));
  PTC_RETURN_IF_ERROR(DecodeBody(f, where, m));
  return m;
}

}  // namespace ptc
