#include "ptc/format/safetensors.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

#include "ptc/format/little_endian.h"

namespace ptc {
namespace {

using nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";
// A valid header nests 3 deep; the cap keeps recursive dump() in Excerpt shallow.
constexpr int kMaxJsonDepth = 16;

Status Bad(std::string_view label, const std::string& message) {
  return InvalidArgumentError(std::string(label) + ": " + message);
}

std::string TensorContext(std::string_view label, std::string_view name) {
  return std::string(label) + ": tensor '" + std::string(name) + "'";
}

// At most ~80 characters of a JSON value, for messages.
std::string Excerpt(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() <= 80 ? s : s.substr(0, 77) + "...";
}

// Validates the header length N of a file of `file_size` (>= 8) bytes.
Status CheckHeaderLength(std::string_view label, uint64_t n, uint64_t file_size) {
  if (n > kMaxSafetensorsHeaderSize)
    return Bad(label, "header length " + std::to_string(n) + " exceeds the limit of " +
                          std::to_string(kMaxSafetensorsHeaderSize) + " bytes");
  if (n > file_size - 8)
    return Bad(label, "header length " + std::to_string(n) + " runs past the end of the " + std::to_string(file_size) +
                          "-byte file");
  return Status::OK();
}

// Bytes of a dense tensor, or nullopt on overflow. REQUIRES: dims >= 0.
std::optional<uint64_t> ByteSize(DType dtype, const Shape& shape) {
  uint64_t n = DTypeSize(dtype);
  for (Index d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  // Elements must also fit an Index (NumElements) for the rest of ptc.
  if (n / DTypeSize(dtype) > static_cast<uint64_t>(std::numeric_limits<Index>::max())) return std::nullopt;
  return n;
}

// Builds the header's JSON value from nlohmann's SAX events, refusing a key
// that repeats within one object (nlohmann would silently keep the last one)
// and nesting deeper than kMaxJsonDepth. One pass, O(log n) per key: the
// object's own map finds a repeated key. (nlohmann's parser callback would
// also do, but at every object's end it scans the whole enclosing object for
// discarded values: quadratic in the number of tensors, 67 s for 50,000.)
// After a refusal the rest is still parsed, not built, so that a syntax error
// anywhere wins as it did.
class HeaderBuilder {
 public:
  bool null() { return Add(json(nullptr)); }
  bool boolean(bool v) { return Add(json(v)); }
  bool number_integer(json::number_integer_t v) { return Add(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return Add(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t& /*text*/) { return Add(json(v)); }
  bool string(json::string_t& v) { return Add(json(std::move(v))); }
  bool binary(json::binary_t& v) { return Add(json(std::move(v))); }  // never in JSON text
  bool start_object(std::size_t /*len*/) { return Open(json::value_t::object); }
  bool start_array(std::size_t /*len*/) { return Open(json::value_t::array); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(json::string_t& key) {
    if (!building()) return true;
    // depth_ counts the open values: 1 for the header object's own keys.
    if (depth_ == 1) top_key_ = key;
    auto [at, fresh] = open_.back()->get_ref<json::object_t&>().try_emplace(key);
    if (!fresh) {
      const std::string where = top_key_ == kMetadataKey ? top_key_ : "tensor '" + top_key_ + "'";
      duplicate_ =
          depth_ == 1 ? "key '" + key + "' appears twice in the header" : where + ": key '" + key + "' appears twice";
      return true;
    }
    slot_ = &at->second;
    return true;
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*token*/, const json::exception& e) {
    error_ = e.what();
    return false;
  }

  // The outcome, in the order of precedence the messages always had.
  Result<json> Finish(std::string_view label) {
    if (error_) {
      std::string what = *error_;
      size_t close = what.find("] ");
      if (close != std::string::npos) what = what.substr(close + 2);
      return Bad(label, "header is not valid JSON: " + what);
    }
    if (too_deep_) return Bad(label, "header nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (duplicate_) return Bad(label, *duplicate_);
    return std::move(root_);
  }

 private:
  bool building() const { return !too_deep_ && !duplicate_; }

  // Stores `v` where the parse is: the root, the next element of the open
  // array, or the slot of the last key of the open object.
  json* Place(json v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      auto& items = parent.get_ref<json::array_t&>();
      items.push_back(std::move(v));
      return &items.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }

  bool Add(json v) {
    if (building()) Place(std::move(v));
    return true;
  }

  bool Open(json::value_t type) {
    if (depth_ >= kMaxJsonDepth) too_deep_ = true;
    ++depth_;
    if (building()) open_.push_back(Place(json(type)));
    return true;
  }

  bool Close() {
    --depth_;
    if (building()) open_.pop_back();
    return true;
  }

  json root_;
  std::vector<json*> open_;  // the open arrays and objects, innermost last
  json* slot_ = nullptr;     // the value of the open object's last key
  int depth_ = 0;
  std::string top_key_;
  std::optional<std::string> duplicate_;
  std::optional<std::string> error_;
  bool too_deep_ = false;
};

// Parses the JSON text of a header: see HeaderBuilder.
Result<json> ParseJson(std::string_view label, std::string_view text) {
  HeaderBuilder builder;
  json::sax_parse(text.begin(), text.end(), &builder);
  PTC_ASSIGN_OR_RETURN(json j, builder.Finish(label));
  if (!j.is_object()) return Bad(label, "header is not a JSON object but " + Excerpt(j));
  return j;
}

Result<std::map<std::string, std::string>> ParseMetadata(std::string_view label, const json& v) {
  if (!v.is_object()) return Bad(label, "__metadata__ is not an object of strings but " + Excerpt(v));
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string())
      return Bad(label, "__metadata__ value of '" + key + "' is not a string but " + Excerpt(value));
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

// An array of unsigned integers (each <= max), or nullopt.
std::optional<std::vector<uint64_t>> UnsignedArray(const json& v, uint64_t max) {
  if (!v.is_array()) return std::nullopt;
  std::vector<uint64_t> out;
  for (const json& x : v) {
    if (!x.is_number_unsigned() || x.get<uint64_t>() > max) return std::nullopt;
    out.push_back(x.get<uint64_t>());
  }
  return out;
}

const json* Field(const json& v, const char* name) {
  auto it = v.find(name);
  return it == v.end() ? nullptr : &*it;
}

Result<Shape> ParseShape(const json* v) {
  if (v == nullptr) return InvalidArgumentError("missing \"shape\"");
  auto dims = UnsignedArray(*v, static_cast<uint64_t>(std::numeric_limits<Index>::max()));
  if (!dims) return InvalidArgumentError("shape " + Excerpt(*v) + " is not an array of integers >= 0");
  return Shape(dims->begin(), dims->end());
}

// Relative [begin, end) of a tensor; checks end <= buffer_size.
Result<std::pair<uint64_t, uint64_t>> ParseOffsets(const json* v, uint64_t buffer_size) {
  if (v == nullptr) return InvalidArgumentError("missing \"data_offsets\"");
  auto offs = UnsignedArray(*v, std::numeric_limits<uint64_t>::max());
  if (!offs || offs->size() != 2 || (*offs)[0] > (*offs)[1])
    return InvalidArgumentError("data_offsets " + Excerpt(*v) +
                                " is not a pair [begin, end] of integers, begin <= end");
  if ((*offs)[1] > buffer_size)
    return InvalidArgumentError("data_offsets " + Excerpt(*v) + " reach past the end of the " +
                                std::to_string(buffer_size) + "-byte data buffer");
  return std::make_pair((*offs)[0], (*offs)[1]);
}

// Errors carry no label; the caller adds "<label>: tensor '<name>'".
Result<SafetensorsEntry> ParseEntry(const std::string& name, const json& v, uint64_t data_start, uint64_t buffer_size) {
  if (!v.is_object()) return InvalidArgumentError("entry is not an object but " + Excerpt(v));
  const json* dtype_json = Field(v, "dtype");
  if (dtype_json == nullptr) return InvalidArgumentError("missing \"dtype\"");
  if (!dtype_json->is_string()) return InvalidArgumentError("dtype " + Excerpt(*dtype_json) + " is not a string");
  PTC_ASSIGN_OR_RETURN(DType dtype, ParseDType(dtype_json->get_ref<const std::string&>()));
  PTC_ASSIGN_OR_RETURN(Shape shape, ParseShape(Field(v, "shape")));
  PTC_ASSIGN_OR_RETURN(auto offsets, ParseOffsets(Field(v, "data_offsets"), buffer_size));
  std::optional<uint64_t> nbytes = ByteSize(dtype, shape);
  if (!nbytes)
    return InvalidArgumentError("shape " + ShapeToString(shape) + " of " + std::string(DTypeName(dtype)) +
                                " overflows 64-bit sizes");
  const uint64_t held = offsets.second - offsets.first;
  if (held != *nbytes)
    return InvalidArgumentError("data_offsets [" + std::to_string(offsets.first) + ", " +
                                std::to_string(offsets.second) + "] hold " + std::to_string(held) +
                                " bytes but shape " + ShapeToString(shape) + " of " + std::string(DTypeName(dtype)) +
                                " needs " + std::to_string(*nbytes));
  return SafetensorsEntry{name, dtype, std::move(shape), data_start + offsets.first, *nbytes};
}

// Sorts the tensors into data order and checks that they tile the buffer.
Status CheckTiling(std::string_view label, SafetensorsHeader& h) {
  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.offset, a.nbytes, a.name) < std::tie(b.offset, b.nbytes, b.name);
  });
  uint64_t expected = h.data_start;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : h.tensors) {
    const std::string where = "data_offsets [" + std::to_string(e.offset - h.data_start) + ", " +
                              std::to_string(e.offset - h.data_start + e.nbytes) + "]";
    if (e.offset > expected)
      return Bad(TensorContext(label, e.name),
                 where + " leave a gap of " + std::to_string(e.offset - expected) + " bytes before it");
    if (e.offset < expected) return Bad(TensorContext(label, e.name), where + " overlap tensor '" + prev->name + "'");
    expected = e.offset + e.nbytes;
    prev = &e;
  }
  if (expected != h.file_size)
    return Bad(label, std::to_string(h.file_size - expected) + " bytes after the last tensor belong to none");
  return Status::OK();
}

}  // namespace

const SafetensorsEntry* SafetensorsHeader::Find(std::string_view name) const {
  for (const SafetensorsEntry& e : tensors) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view label, std::string_view prefix, uint64_t file_size) {
  if (file_size < 8)
    return Bad(label, "file of " + std::to_string(file_size) + " bytes is shorter than the 8-byte header length");
  if (prefix.size() > file_size)
    return Bad(label, "prefix of " + std::to_string(prefix.size()) + " bytes is longer than the file");
  if (prefix.size() < 8) return Bad(label, "prefix holds fewer than the 8 bytes of the header length");
  const uint64_t n = internal::Get64(prefix.data());
  PTC_RETURN_IF_ERROR(CheckHeaderLength(label, n, file_size));
  if (prefix.size() - 8 < n)
    return Bad(label,
               "prefix holds " + std::to_string(prefix.size()) + " of the " + std::to_string(8 + n) + " header bytes");
  PTC_ASSIGN_OR_RETURN(json j, ParseJson(label, prefix.substr(8, n)));
  SafetensorsHeader h;
  h.data_start = 8 + n;
  h.file_size = file_size;
  for (const auto& [key, value] : j.items()) {
    if (key == kMetadataKey) {
      PTC_ASSIGN_OR_RETURN(h.metadata, ParseMetadata(label, value));
      continue;
    }
    PTC_ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(key, value, h.data_start, file_size - h.data_start),
                         TensorContext(label, key));
    h.tensors.push_back(std::move(e));
  }
  PTC_RETURN_IF_ERROR(CheckTiling(label, h));
  return h;
}

Result<SafetensorsHeader> ReadSafetensorsHeader(Env* env, const std::string& path) {
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->OpenRead(path));
  const uint64_t size = file->Size();
  if (size < 8) return ParseSafetensorsHeader(path, "", size);
  std::string prefix(8, '\0');
  PTC_RETURN_IF_ERROR(file->Read(0, 8, prefix.data()));
  const uint64_t n = internal::Get64(prefix.data());
  PTC_RETURN_IF_ERROR(CheckHeaderLength(path, n, size));  // before allocating n bytes
  prefix.resize(8 + n);
  if (n > 0) PTC_RETURN_IF_ERROR(file->Read(8, n, prefix.data() + 8));
  return ParseSafetensorsHeader(path, prefix, size);
}

Result<std::string> EncodeSafetensorsHeader(const std::vector<TensorSpec>& tensors,
                                            const std::map<std::string, std::string>& metadata) {
  std::unordered_set<std::string_view> names;
  std::vector<uint64_t> ends;  // of each tensor's data
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    const std::string where = "tensor '" + t.name + "'";
    if (t.name.empty() || t.name == kMetadataKey) return InvalidArgumentError("invalid tensor name '" + t.name + "'");
    if (!names.insert(t.name).second) return InvalidArgumentError(where + " is listed twice");
    if (std::any_of(t.shape.begin(), t.shape.end(), [](Index d) { return d < 0; }))
      return InvalidArgumentError(where + ": negative dimension in shape " + ShapeToString(t.shape));
    std::optional<uint64_t> nbytes = ByteSize(t.dtype, t.shape);
    if (!nbytes || __builtin_add_overflow(offset, *nbytes, &offset))
      return InvalidArgumentError(where + ": shape " + ShapeToString(t.shape) + " overflows 64-bit sizes");
    ends.push_back(offset);
  }
  // The object's text is written member by member, as dump() would write it:
  // an ordered_json object finds a key by a linear search, which made this
  // quadratic in the number of tensors.
  using ordered_json = nlohmann::ordered_json;
  std::string text = "{";
  auto member = [&text](const std::string& key, const ordered_json& value) {
    if (text.size() > 1) text += ',';
    text += ordered_json(key).dump();
    text += ':';
    text += value.dump();
  };
  try {
    if (!metadata.empty()) member(std::string(kMetadataKey), metadata);
    uint64_t begin = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorSpec& t = tensors[i];
      member(t.name, {{"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {begin, ends[i]}}});
      begin = ends[i];
    }
  } catch (const ordered_json::exception&) {
    return InvalidArgumentError("a tensor name or metadata text is not valid UTF-8");
  }
  text += '}';
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  std::string out;
  internal::Put64(out, text.size());
  return out + text;
}

SafetensorsWriter::SafetensorsWriter(std::string path, SafetensorsHeader header, std::unique_ptr<WritableFile> file)
    : path_(std::move(path)), header_(std::move(header)), file_(std::move(file)), written_(header_.data_start) {}

SafetensorsWriter::~SafetensorsWriter() = default;

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(Env* env, const std::string& path,
                                                                     std::vector<TensorSpec> tensors,
                                                                     std::map<std::string, std::string> metadata) {
  return Start(path, tensors, metadata, [&] { return env->OpenWrite(path); });
}

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(OutputDir& dir, const std::string& name,
                                                                     std::vector<TensorSpec> tensors,
                                                                     std::map<std::string, std::string> metadata) {
  return Start(JoinPath(dir.path(), name), tensors, metadata, [&] { return dir.NewWritableFile(name); });
}

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Start(
    const std::string& path, const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata,
    const std::function<Result<std::unique_ptr<WritableFile>>()>& open) {
  PTC_ASSIGN_OR_RETURN(std::string bytes, EncodeSafetensorsHeader(tensors, metadata), path);
  uint64_t size = bytes.size();
  for (const TensorSpec& t : tensors) size += *ByteSize(t.dtype, t.shape);  // checked by Encode
  // Parsing our own header yields the layout and checks the encoder.
  PTC_ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(path, bytes, size));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, open());
  PTC_RETURN_IF_ERROR(file->Append(bytes.data(), bytes.size()));
  return std::unique_ptr<SafetensorsWriter>(new SafetensorsWriter(path, std::move(header), std::move(file)));
}

Status SafetensorsWriter::Append(const void* data, size_t n) {
  if (finished_) return FailedPreconditionError(path_ + ": Append after Finish");
  if (n > header_.file_size - written_)
    return FailedPreconditionError(path_ + ": appending " + std::to_string(n) + " bytes passes the end of the data (" +
                                   std::to_string(written_ - header_.data_start) + " of " +
                                   std::to_string(header_.file_size - header_.data_start) + " bytes written)");
  PTC_RETURN_IF_ERROR(file_->Append(data, n));
  written_ += n;
  return Status::OK();
}

Status SafetensorsWriter::Finish() {
  if (finished_) return FailedPreconditionError(path_ + ": Finish called twice");
  for (const SafetensorsEntry& e : header_.tensors) {
    if (e.offset + e.nbytes <= written_) continue;
    const uint64_t got = written_ > e.offset ? written_ - e.offset : 0;
    return FailedPreconditionError(TensorContext(path_, e.name) + ": only " + std::to_string(got) + " of " +
                                   std::to_string(e.nbytes) + " bytes written");
  }
  PTC_RETURN_IF_ERROR(file_->Sync());
  PTC_RETURN_IF_ERROR(file_->Close());
  finished_ = true;
  return Status::OK();
}

}  // namespace ptc
