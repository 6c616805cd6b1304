// JSON of etcd's v3 gateway.
#include "cluster/etcd_codec.h"

#include <charconv>

#include <nlohmann/json.hpp>

#include "cluster/base64.h"
#include "ptc/base/json_fields.h"

namespace ptc::cluster {
namespace {

using nlohmann::json;

const char* TargetName(Compare::Target t) {
  switch (t) {
    case Compare::Target::kVersion:
      return "VERSION";
    case Compare::Target::kCreateRevision:
      return "CREATE";
    case Compare::Target::kModRevision:
      return "MOD";
    case Compare::Target::kValue:
      return "VALUE";
  }
  return "MOD";
}

const char* OpName(Compare::Op op) {
  switch (op) {
    case Compare::Op::kEqual:
      return "EQUAL";
    case Compare::Op::kNotEqual:
      return "NOT_EQUAL";
    case Compare::Op::kGreater:
      return "GREATER";
    case Compare::Op::kLess:
      return "LESS";
  }
  return "EQUAL";
}

json PutJson(std::string_view key, std::string_view value, int64_t lease) {
  json j = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) j["lease"] = std::to_string(lease);
  return j;
}

json RangeJson(std::string_view key, std::string_view range_end) {
  json j = {{"key", Base64Encode(key)}};
  if (!range_end.empty()) j["range_end"] = Base64Encode(range_end);
  return j;
}

json OpJson(const TxnOp& op) {
  switch (op.kind) {
    case TxnOp::Kind::kPut:
      return {{"request_put", PutJson(op.key, op.value, op.lease)}};
    case TxnOp::Kind::kDelete:
      return {{"request_delete_range", RangeJson(op.key, "")}};
    case TxnOp::Kind::kDeletePrefix:
      return {{"request_delete_range", RangeJson(op.key, PrefixRangeEnd(op.key))}};
  }
  return json::object();
}

Result<json> Parse(std::string_view where, std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return CorruptionError(std::string(where) +
                           ": the answer is not a JSON object: " + std::string(body.substr(0, 200)));
  }
  return j;
}

// An int64 member: a decimal string (grpc-gateway) or a number; 0 when absent.
Result<int64_t> Int64(const JsonFields& f, std::string_view key) {
  const json* v = f.Find(key);
  if (v == nullptr) return int64_t{0};
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    int64_t out = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (!s.empty() && ec == std::errc() && p == s.data() + s.size()) return out;
  }
  return f.Error(key, "must be an int64");
}

Result<std::string> Bytes(const JsonFields& f, std::string_view key) {
  const json* v = f.Find(key);
  if (v == nullptr) return std::string();
  if (!v->is_string()) return f.Error(key, "must be a base64 string");
  Result<std::string> r = Base64Decode(v->get_ref<const std::string&>());
  if (!r.ok()) return f.Error(key, r.status().message());
  return r;
}

Result<int64_t> HeaderRevision(std::string_view where, const json& j) {
  JsonFields f(j, std::string(where));
  const json* h = f.Find("header");
  if (h == nullptr || !h->is_object()) return f.Error("header", "is missing");
  return Int64(JsonFields(*h, std::string(where) + ": header"), "revision");
}

Result<KeyValue> DecodeKeyValue(const JsonFields& f) {
  KeyValue kv;
  PTC_ASSIGN_OR_RETURN(kv.key, Bytes(f, "key"));
  PTC_ASSIGN_OR_RETURN(kv.value, Bytes(f, "value"));
  PTC_ASSIGN_OR_RETURN(kv.create_revision, Int64(f, "create_revision"));
  PTC_ASSIGN_OR_RETURN(kv.mod_revision, Int64(f, "mod_revision"));
  PTC_ASSIGN_OR_RETURN(kv.version, Int64(f, "version"));
  PTC_ASSIGN_OR_RETURN(kv.lease, Int64(f, "lease"));
  return kv;
}

}  // namespace

std::string PrefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

std::string EncodePutRequest(std::string_view key, std::string_view value, int64_t lease) {
  return PutJson(key, value, lease).dump();
}

std::string EncodeRangeRequest(std::string_view key, std::string_view range_end) {
  return RangeJson(key, range_end).dump();
}

std::string EncodeDeleteRangeRequest(std::string_view key, std::string_view range_end) {
  return RangeJson(key, range_end).dump();
}

std::string EncodeTxnRequest(const TxnRequest& txn) {
  json compare = json::array(), success = json::array(), failure = json::array();
  for (const Compare& c : txn.compare) {
    json j = {{"key", Base64Encode(c.key)}, {"target", TargetName(c.target)}, {"result", OpName(c.op)}};
    switch (c.target) {
      case Compare::Target::kVersion:
        j["version"] = std::to_string(c.number);
        break;
      case Compare::Target::kCreateRevision:
        j["create_revision"] = std::to_string(c.number);
        break;
      case Compare::Target::kModRevision:
        j["mod_revision"] = std::to_string(c.number);
        break;
      case Compare::Target::kValue:
        j["value"] = Base64Encode(c.value);
        break;
    }
    compare.push_back(std::move(j));
  }
  for (const TxnOp& op : txn.success) success.push_back(OpJson(op));
  for (const TxnOp& op : txn.failure) failure.push_back(OpJson(op));
  return json{{"compare", compare}, {"success", success}, {"failure", failure}}.dump();
}

std::string EncodeLeaseGrantRequest(int64_t ttl_seconds) { return json{{"TTL", std::to_string(ttl_seconds)}}.dump(); }

std::string EncodeLeaseIdRequest(int64_t id) { return json{{"ID", std::to_string(id)}}.dump(); }

std::string EncodeWatchCreateRequest(std::string_view key, std::string_view range_end, int64_t start_revision) {
  json create = RangeJson(key, range_end);
  create["start_revision"] = std::to_string(start_revision);
  return json{{"create_request", create}}.dump();
}

Status DecodeErrorBody(std::string_view where, std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("code")) return Status::OK();
  const json* code = &j["code"];
  const json* msg = j.contains("message") ? &j["message"] : j.contains("error") ? &j["error"] : nullptr;
  std::string message = std::string(where) + ": " + (msg && msg->is_string() ? msg->get<std::string>() : "error");
  const int c = code->is_number_integer() ? code->get<int>() : -1;
  switch (c) {
    case 0:
      return Status::OK();
    case 3:
      return InvalidArgumentError(message);
    case 5:
      return NotFoundError(message);
    case 7:
    case 16:
      return Status(Code::kPermissionDenied, message);
    case 9:
      return FailedPreconditionError(message);
    default:
      return IOError(message + " (gRPC code " + std::to_string(c) + ")");
  }
}

Result<int64_t> DecodeRevision(std::string_view where, std::string_view body) {
  PTC_ASSIGN_OR_RETURN(json j, Parse(where, body));
  return HeaderRevision(where, j);
}

Result<RangeResponse> DecodeRangeResponse(std::string_view where, std::string_view body) {
  PTC_ASSIGN_OR_RETURN(json j, Parse(where, body));
  RangeResponse r;
  PTC_ASSIGN_OR_RETURN(r.revision, HeaderRevision(where, j));
  JsonFields f(j, std::string(where));
  if (const json* kvs = f.Find("kvs")) {
    if (!kvs->is_array()) return f.Error("kvs", "must be an array");
    for (size_t i = 0; i < kvs->size(); ++i) {
      const json& e = (*kvs)[i];
      if (!e.is_object()) return f.Error("kvs", "must hold objects");
      PTC_ASSIGN_OR_RETURN(KeyValue kv,
                           DecodeKeyValue(JsonFields(e, std::string(where) + ": kvs[" + std::to_string(i) + "]")));
      r.kvs.push_back(std::move(kv));
    }
  }
  return r;
}

Result<int64_t> DecodeDeleteRangeResponse(std::string_view where, std::string_view body) {
  PTC_ASSIGN_OR_RETURN(json j, Parse(where, body));
  return Int64(JsonFields(j, std::string(where)), "deleted");
}

Result<TxnResponse> DecodeTxnResponse(std::string_view where, std::string_view body) {
  PTC_ASSIGN_OR_RETURN(json j, Parse(where, body));
  TxnResponse r;
  PTC_ASSIGN_OR_RETURN(r.revision, HeaderRevision(where, j));
  JsonFields f(j, std::string(where));
  if (const json* s = f.Find("succeeded")) {
    if (!s->is_boolean()) return f.Error("succeeded", "must be a boolean");
    r.succeeded = s->get<bool>();
  }
  return r;
}

Result<Lease> DecodeLeaseGrantResponse(std::string_view where, std::string_view body) {
  PTC_ASSIGN_OR_RETURN(json j, Parse(where, body));
  JsonFields f(j, std::string(where));
  Lease lease;
  PTC_ASSIGN_OR_RETURN(lease.id, Int64(f, "ID"));
  PTC_ASSIGN_OR_RETURN(lease.ttl, Int64(f, "TTL"));
  if (lease.id == 0) return f.Error("ID", "is missing");
  if (const json* e = f.Find("error"); e != nullptr && e->is_string() && !e->get<std::string>().empty()) {
    return IOError(std::string(where) + ": " + e->get<std::string>());
  }
  return lease;
}

Result<int64_t> DecodeLeaseKeepAliveResponse(std::string_view where, std::string_view body) {
  // A stream of one JSON object per line; the first answers our one request.
  const size_t nl = body.find('\n');
  PTC_ASSIGN_OR_RETURN(json j, Parse(where, body.substr(0, nl)));
  JsonFields f(j, std::string(where));
  if (const json* e = f.Find("error")) {
    PTC_RETURN_IF_ERROR(DecodeErrorBody(where, e->is_object() ? e->dump() : j.dump()));
  }
  const json* result = f.Find("result");
  if (result == nullptr || !result->is_object()) return f.Error("result", "is missing");
  return Int64(JsonFields(*result, std::string(where) + ": result"), "TTL");
}

Result<WatchMessage> DecodeWatchMessage(std::string_view where, std::string_view line) {
  PTC_ASSIGN_OR_RETURN(json j, Parse(where, line));
  JsonFields f(j, std::string(where));
  if (const json* e = f.Find("error")) {
    // A stream error: {"error": {"grpc_code", "http_code", "message", ...}}.
    const json* message = e->is_object() && e->contains("message") ? &(*e)["message"] : nullptr;
    return IOError(std::string(where) + ": the watch failed: " +
                   (message && message->is_string() ? message->get<std::string>() : e->dump().substr(0, 200)));
  }
  const json* result = f.Find("result");
  if (result == nullptr || !result->is_object()) return f.Error("result", "is missing");
  JsonFields r(*result, std::string(where) + ": result");
  WatchMessage m;
  PTC_ASSIGN_OR_RETURN(m.revision, HeaderRevision(std::string(where) + ": result", *result));
  for (auto [key, out] : {std::pair{"created", &m.created}, std::pair{"canceled", &m.canceled}}) {
    if (const json* v = r.Find(key)) {
      if (!v->is_boolean()) return r.Error(key, "must be a boolean");
      *out = v->get<bool>();
    }
  }
  PTC_ASSIGN_OR_RETURN(m.compact_revision, Int64(r, "compact_revision"));
  if (const json* events = r.Find("events")) {
    if (!events->is_array()) return r.Error("events", "must be an array");
    m.events = events->size();
  }
  return m;
}

}  // namespace ptc::cluster
