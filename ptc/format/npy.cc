#include "ptc/format/npy.h"

#include <array>
#include <limits>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "ptc/format/little_endian.h"

namespace ptc {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kAlign = 64;

struct Descr {
  DType dtype;
  std::string_view descr;  // as we write it
  bool raw;                // a void type standing in for a dtype numpy lacks
};

constexpr std::array<Descr, kNumDTypes> kDescrs = {{
    {DType::kF64, "<f8", false},
    {DType::kF32, "<f4", false},
    {DType::kF16, "<f2", false},
    {DType::kBF16, "<V2", true},
    {DType::kI64, "<i8", false},
    {DType::kI32, "<i4", false},
    {DType::kI16, "<i2", false},
    {DType::kI8, "|i1", false},
    {DType::kU8, "|u1", false},
    {DType::kBool, "|b1", false},
    {DType::kF8E4M3, "|V1", true},
    {DType::kF8E5M2, "|V1", true},
}};

Status Bad(std::string_view label, const std::string& message) {
  return InvalidArgumentError(std::string(label) + ": " + message);
}

// Bytes of a dense tensor, or nullopt on a negative dimension or overflow.
std::optional<uint64_t> ByteSize(DType dtype, const Shape& shape) {
  uint64_t n = DTypeSize(dtype);
  for (Index d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  if (n / DTypeSize(dtype) > static_cast<uint64_t>(std::numeric_limits<Index>::max())) return std::nullopt;
  return n;
}

// "()", "(5,)", "(2, 3)": Python's repr of a tuple.
std::string ShapeTuple(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// Maps a descr as numpy may write it ("<f4", "|u1", "|V2", "<V2") to ours.
std::optional<Descr> FindDescr(std::string_view text) {
  if (text.size() < 2) return std::nullopt;
  const char order = text[0];
  const std::string_view code = text.substr(1);
  for (const Descr& d : kDescrs) {
    if (d.descr.substr(1) != code) continue;
    // One byte and raw bytes have no byte order; the others must be little-endian.
    const bool orderless = d.raw || DTypeSize(d.dtype) == 1;
    if (order == '<' || (orderless && (order == '|' || order == '>'))) return d;
    return std::nullopt;
  }
  return std::nullopt;
}

// A cursor over the header's Python dict literal. Each Parse* returns false
// (and leaves an explanation in `error`) on malformed text.
struct DictReader {
  std::string_view text;
  size_t pos = 0;
  std::string error;

  void SkipSpace() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r'))
      ++pos;
  }
  bool Fail(const std::string& what) {
    if (error.empty()) error = what + " at byte " + std::to_string(pos) + " of the header dict";
    return false;
  }
  bool Accept(char c) {
    SkipSpace();
    if (pos < text.size() && text[pos] == c) return ++pos, true;
    return false;
  }
  bool Expect(char c) { return Accept(c) || Fail(std::string("expected '") + c + "'"); }
  bool ParseString(std::string& out) {
    SkipSpace();
    if (pos >= text.size() || (text[pos] != '\'' && text[pos] != '"')) return Fail("expected a quoted string");
    const char quote = text[pos++];
    const size_t end = text.find(quote, pos);
    if (end == std::string_view::npos) return Fail("unterminated string");
    out = std::string(text.substr(pos, end - pos));
    if (out.find('\\') != std::string::npos) return Fail("escape sequences are not supported");
    pos = end + 1;
    return true;
  }
  bool ParseBool(bool& out) {
    SkipSpace();
    for (auto [word, value] : {std::pair<std::string_view, bool>{"True", true}, {"False", false}}) {
      if (text.substr(pos, word.size()) == word) return pos += word.size(), out = value, true;
    }
    return Fail("expected True or False");
  }
  bool ParseDim(Index& out) {
    SkipSpace();
    if (pos < text.size() && text[pos] == '-') return Fail("negative dimension");
    const size_t start = pos;
    uint64_t v = 0;
    for (; pos < text.size() && text[pos] >= '0' && text[pos] <= '9'; ++pos) {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, uint64_t(text[pos] - '0'), &v) ||
          v > uint64_t(std::numeric_limits<Index>::max()))
        return Fail("dimension too large");
    }
    if (pos == start) return Fail("expected a dimension");
    out = static_cast<Index>(v);
    return true;
  }
  // "()", "(5,)", "(2, 3)", "(2, 3,)".
  bool ParseShape(Shape& out) {
    if (!Expect('(')) return false;
    out.clear();
    while (!Accept(')')) {
      Index d = 0;
      if (!ParseDim(d)) return false;
      out.push_back(d);
      if (Accept(')')) break;
      if (!Accept(',')) return Fail("expected ',' or ')'");
    }
    return true;
  }
};

// Parses the dict into `h` (dtype, raw, shape).
Status ParseDict(std::string_view label, std::string_view text, NpyHeader& h) {
  DictReader r{text, 0, {}};
  std::string descr;
  bool fortran = false;
  bool seen[3] = {false, false, false};
  static constexpr std::string_view kKeys[3] = {"descr", "fortran_order", "shape"};
  if (!r.Expect('{')) return Bad(label, r.error);
  while (!r.Accept('}')) {
    std::string key;
    if (!r.ParseString(key) || !r.Expect(':')) return Bad(label, r.error);
    int k = 0;
    while (k < 3 && kKeys[k] != key) ++k;
    if (k == 3) return Bad(label, "header dict has the unexpected key '" + key + "'");
    if (seen[k]) return Bad(label, "header dict repeats the key '" + key + "'");
    seen[k] = true;
    const bool ok = k == 0 ? r.ParseString(descr) : k == 1 ? r.ParseBool(fortran) : r.ParseShape(h.shape);
    if (!ok) return Bad(label, r.error + " (value of '" + key + "')");
    if (r.Accept('}')) break;
    if (!r.Accept(',')) return Bad(label, (r.Fail("expected ',' or '}'"), r.error));
  }
  r.SkipSpace();
  if (r.pos != text.size()) return Bad(label, "unexpected text after the header dict at byte " + std::to_string(r.pos));
  for (int k = 0; k < 3; ++k) {
    if (!seen[k]) return Bad(label, "header dict lacks the key '" + std::string(kKeys[k]) + "'");
  }
  if (fortran) return Bad(label, "fortran_order True is not supported (write C-order arrays)");
  std::optional<Descr> d = FindDescr(descr);
  if (!d) return Bad(label, "descr '" + descr + "' is not one of <f8 <f4 <f2 <i8 <i4 <i2 |i1 |u1 |b1 <V2 |V1");
  h.dtype = d->dtype;
  h.raw = d->raw;
  return Status::OK();
}

}  // namespace

std::string_view NpyDescr(DType dtype) { return kDescrs[static_cast<size_t>(dtype)].descr; }

std::string EncodeNpyHeader(DType dtype, const Shape& shape) {
  const std::string dict =
      "{'descr': '" + std::string(NpyDescr(dtype)) + "', 'fortran_order': False, 'shape': " + ShapeTuple(shape) + ", }";
  size_t preamble = 10;  // magic, version, u16 length
  size_t total = (preamble + dict.size() + 1 + kAlign - 1) / kAlign * kAlign;
  if (total - preamble > 0xffff) {
    preamble = 12;  // version 2.0: u32 length
    total = (preamble + dict.size() + 1 + kAlign - 1) / kAlign * kAlign;
  }
  const uint64_t len = total - preamble;
  std::string out(kMagic);
  out += preamble == 10 ? '\x01' : '\x02';
  out += '\0';
  internal::PutLittleEndian(out, len, preamble - 8);
  out += dict;
  out.append(total - out.size() - 1, ' ');
  return out + '\n';
}

Result<NpyHeader> ParseNpyHeader(std::string_view label, std::string_view prefix) {
  if (prefix.size() < 10 || prefix.substr(0, 6) != kMagic)
    return Bad(label, "not an npy file (no \\x93NUMPY magic and version)");
  const int major = static_cast<unsigned char>(prefix[6]), minor = static_cast<unsigned char>(prefix[7]);
  if (minor != 0 || major < 1 || major > 3)
    return Bad(label, "unsupported npy version " + std::to_string(major) + "." + std::to_string(minor));
  const size_t preamble = major == 1 ? 10 : 12;
  if (prefix.size() < preamble) return Bad(label, "file ends inside the npy preamble");
  const uint64_t len = internal::GetLittleEndian(prefix.substr(8, preamble - 8));
  if (len > prefix.size() - preamble)
    return Bad(label, "header of " + std::to_string(preamble + len) + " bytes runs past the " +
                          std::to_string(prefix.size()) + " bytes given");
  NpyHeader h;
  PTC_RETURN_IF_ERROR(ParseDict(label, prefix.substr(preamble, len), h));
  std::optional<uint64_t> nbytes = ByteSize(h.dtype, h.shape);
  if (!nbytes) return Bad(label, "shape " + ShapeToString(h.shape) + " overflows 64-bit sizes");
  h.data_offset = preamble + len;
  h.nbytes = *nbytes;
  return h;
}

Result<std::string> EncodeNpyDTypes(const std::map<std::string, DType>& files) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, dtype] : files) j[name] = DTypeName(dtype);
  try {
    return j.dump(2) + "\n";
  } catch (const nlohmann::json::exception&) {
    return InvalidArgumentError("a file name in " + std::string(kNpyDTypesFile) + " is not valid UTF-8");
  }
}

Result<std::map<std::string, DType>> ParseNpyDTypes(std::string_view label, std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad(label, "not a JSON object of file name -> dtype");
  std::map<std::string, DType> out;
  for (const auto& [name, value] : j.items()) {
    if (!value.is_string()) return Bad(label, "dtype of '" + name + "' is not a string");
    PTC_ASSIGN_OR_RETURN(out[name], ParseDType(value.get<std::string>()), std::string(label) + ": '" + name + "'");
  }
  return out;
}

NpyWriter::NpyWriter(std::string path, std::unique_ptr<WritableFile> file, uint64_t nbytes)
    : path_(std::move(path)), file_(std::move(file)), nbytes_(nbytes) {}

NpyWriter::~NpyWriter() = default;

Result<std::unique_ptr<NpyWriter>> NpyWriter::Create(Env* env, const std::string& path, DType dtype,
                                                     const Shape& shape) {
  return Start(path, dtype, shape, [&] { return env->OpenWrite(path); });
}

Result<std::unique_ptr<NpyWriter>> NpyWriter::Create(OutputDir& dir, const std::string& name, DType dtype,
                                                     const Shape& shape) {
  return Start(JoinPath(dir.path(), name), dtype, shape, [&] { return dir.NewWritableFile(name); });
}

Result<std::unique_ptr<NpyWriter>> NpyWriter::Start(
    const std::string& path, DType dtype, const Shape& shape,
    const std::function<Result<std::unique_ptr<WritableFile>>()>& open) {
  std::optional<uint64_t> nbytes = ByteSize(dtype, shape);
  if (!nbytes)
    return Bad(path, "shape " + ShapeToString(shape) + " has a negative dimension or overflows 64-bit sizes");
  const std::string header = EncodeNpyHeader(dtype, shape);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, open());
  PTC_RETURN_IF_ERROR(file->Append(header.data(), header.size()));
  return std::unique_ptr<NpyWriter>(new NpyWriter(path, std::move(file), *nbytes));
}

Status NpyWriter::Append(const void* data, size_t n) {
  if (finished_) return FailedPreconditionError(path_ + ": Append after Finish");
  if (n > nbytes_ - written_)
    return FailedPreconditionError(path_ + ": appending " + std::to_string(n) + " bytes passes the end of the data (" +
                                   std::to_string(written_) + " of " + std::to_string(nbytes_) + " bytes written)");
  PTC_RETURN_IF_ERROR(file_->Append(data, n));
  written_ += n;
  return Status::OK();
}

Status NpyWriter::Finish() {
  if (finished_) return FailedPreconditionError(path_ + ": Finish called twice");
  if (written_ != nbytes_)
    return FailedPreconditionError(path_ + ": only " + std::to_string(written_) + " of " + std::to_string(nbytes_) +
                                   " data bytes written");
  PTC_RETURN_IF_ERROR(file_->Sync());
  PTC_RETURN_IF_ERROR(file_->Close());
  finished_ = true;
  return Status::OK();
}

}  // namespace ptc
