#include "cluster/change_request.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

namespace ptc::cluster {
namespace {

constexpr std::string_view kSave = "save";
constexpr std::string_view kDcpSave = "dcp-save";
constexpr std::string_view kCompact = "compact";
constexpr std::string_view kRankFiles = "rank-files";

// The text up to the first space (all of it without one).
std::string_view FirstWord(std::string_view text) { return text.substr(0, text.find(' ')); }

// Whether `text` is all of one decimal number that fits `out`.
template <typename T>
bool ParseDecimal(std::string_view text, T& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size();
}

// Takes the next field of `rest`: up to a space (taken too) or its end.
std::string_view NextField(std::string_view& rest) {
  const size_t space = rest.find(' ');
  const std::string_view field = rest.substr(0, space);
  rest.remove_prefix(space == std::string_view::npos ? rest.size() : space + 1);
  return field;
}

class Decoder {
 public:
  Decoder(std::string_view where, std::string_view text) : where_(where), text_(text) {}

  Status Error(std::string_view field, std::string_view what) const {
    return CorruptionError(std::string(where_) + ": request '" + Abbreviate(text_) + "': \"" + std::string(field) +
                           "\" " + std::string(what));
  }

  // After "save ".
  Result<ChangeRequest> Save(std::string_view rest) const {
    SaveRequest r;
    if (!ParseDecimal(rest, r.iteration)) return Error("iteration", "must be a decimal number");
    return ChangeRequest(r);
  }

  // After "dcp-save ".
  Result<ChangeRequest> DcpSave(std::string_view rest) const {
    DcpSaveRequest r;
    if (!ParseDecimal(NextField(rest), r.worker)) return Error("worker", "must be a decimal number");
    if (!ParseDecimal(NextField(rest), r.bytes)) return Error("bytes", "must be a decimal number");
    const std::string_view checksum = NextField(rest);
    auto [end, ec] = std::from_chars(checksum.data(), checksum.data() + checksum.size(), r.checksum, 16);
    if (checksum.size() != 16 || ec != std::errc() || end != checksum.data() + checksum.size()) {
      return Error("checksum", "must be 16 hexadecimal digits");
    }
    r.save = std::string(rest);  // the rest, spaces and all
    return ChangeRequest(std::move(r));
  }

  // The whole text begins "compact".
  Result<ChangeRequest> Compaction() const {
    if (text_ == kCompact) return ChangeRequest(CompactionRequest{false});
    if (text_.substr(kCompact.size()) == " " + std::string(kRankFiles)) return ChangeRequest(CompactionRequest{true});
    return Error("into", "must be nothing or 'rank-files'");
  }

 private:
  const std::string_view where_, text_;
};

}  // namespace

Status ValidateRequest(const ChangeRequest& request) {
  if (const auto* r = std::get_if<RelayoutRequest>(&request)) {
    if (r->config.empty()) return InvalidArgumentError("change request: \"config\" is empty");
    const std::string_view word = FirstWord(r->config);
    if (word == kSave || word == kDcpSave || word == kCompact) {
      return InvalidArgumentError("change request: \"config\" '" + Abbreviate(r->config) + "' begins with '" +
                                  std::string(word) + "', another kind of change");
    }
  } else if (const auto* d = std::get_if<DcpSaveRequest>(&request)) {
    if (d->worker < 0)
      return InvalidArgumentError("DCP save request: \"worker\" " + std::to_string(d->worker) + " < 0");
    if (d->bytes > kMaxDcpMetadataBytes) {
      return InvalidArgumentError("DCP save request: \"bytes\" " + std::to_string(d->bytes) + " > " +
                                  std::to_string(kMaxDcpMetadataBytes));
    }
    if (d->save.empty()) return InvalidArgumentError("DCP save request: \"save\" is empty");
  }
  return Status::OK();
}

std::string EncodeRequest(const ChangeRequest& request) {
  struct Encode {
    std::string operator()(const RelayoutRequest& r) const { return r.config; }
    std::string operator()(const SaveRequest& r) const {
      return std::string(kSave) + " " + std::to_string(r.iteration);
    }
    std::string operator()(const DcpSaveRequest& r) const {
      char checksum[17];
      std::snprintf(checksum, sizeof checksum, "%016llx", static_cast<unsigned long long>(r.checksum));
      return std::string(kDcpSave) + " " + std::to_string(r.worker) + " " + std::to_string(r.bytes) + " " + checksum +
             " " + r.save;
    }
    std::string operator()(const CompactionRequest& r) const {
      return r.rank_files ? std::string(kCompact) + " " + std::string(kRankFiles) : std::string(kCompact);
    }
  };
  return std::visit(Encode{}, request);
}

Result<ChangeRequest> DecodeRequest(std::string_view where, std::string_view text) {
  const Decoder decoder(where, text);
  const std::string_view word = FirstWord(text);
  const std::string_view rest = text.substr(std::min(text.size(), word.size() + 1));
  Result<ChangeRequest> r = word == kSave      ? decoder.Save(rest)
                            : word == kDcpSave ? decoder.DcpSave(rest)
                            : word == kCompact ? decoder.Compaction()
                                               : Result<ChangeRequest>(RelayoutRequest{std::string(text)});
  if (!r.ok()) return r;
  if (Status s = ValidateRequest(*r); !s.ok()) return CorruptionError(std::string(where) + ": " + s.message());
  return r;
}

}  // namespace ptc::cluster
