// The JSON of etcd's v3 gateway (etcd 3.4: POST http://HOST:PORT/v3/...,
// grpc-gateway): request bodies made from etcd_types.h values, and those
// values parsed from response bodies. Keys and values travel base64-encoded;
// int64 fields as decimal strings; fields that are zero, false or empty are
// left out of responses.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "cluster/etcd_types.h"
#include "ptc/base/status.h"

namespace ptc::cluster {

// The end of the range holding every key that starts with `prefix` (etcd's
// clientv3.GetPrefixRangeEnd): the prefix with its last byte below 0xff
// incremented and the rest cut; "\0" (every key) when there is none.
std::string PrefixRangeEnd(std::string_view prefix);

// Request bodies. range_end "" means the single key.
std::string EncodePutRequest(std::string_view key, std::string_view value, int64_t lease);
std::string EncodeRangeRequest(std::string_view key, std::string_view range_end);
std::string EncodeDeleteRangeRequest(std::string_view key, std::string_view range_end);
std::string EncodeTxnRequest(const TxnRequest& txn);
std::string EncodeLeaseGrantRequest(int64_t ttl_seconds);
// {"ID": id}: keepalive and revoke.
std::string EncodeLeaseIdRequest(int64_t id);
// {"create_request": ...}: a watch of [key, range_end) from start_revision.
std::string EncodeWatchCreateRequest(std::string_view key, std::string_view range_end, int64_t start_revision);

// The gateway's error body {"error": ..., "code": GRPC_CODE, "message": ...}
// as a Status: NotFound (5), InvalidArgument (3), FailedPrecondition (9),
// PermissionDenied (7, 16), else IOError; `where` starts the message. OK when
// `body` is no error body.
Status DecodeErrorBody(std::string_view where, std::string_view body);

// Response bodies. Every \error is Corruption naming `where` and the field:
// not JSON, or a field of the wrong type or base64.
// The header's revision.
Result<int64_t> DecodeRevision(std::string_view where, std::string_view body);
Result<RangeResponse> DecodeRangeResponse(std::string_view where, std::string_view body);
// The number of keys deleted.
Result<int64_t> DecodeDeleteRangeResponse(std::string_view where, std::string_view body);
Result<TxnResponse> DecodeTxnResponse(std::string_view where, std::string_view body);
Result<Lease> DecodeLeaseGrantResponse(std::string_view where, std::string_view body);
// The keepalive stream's first message {"result": {"ID", "TTL"}}: the TTL left,
// 0 when the lease no longer exists.
Result<int64_t> DecodeLeaseKeepAliveResponse(std::string_view where, std::string_view body);
// One line of the watch stream: {"result": WatchResponse}; a stream error
// ({"error": ...}) is its Status (as DecodeErrorBody).
Result<WatchMessage> DecodeWatchMessage(std::string_view where, std::string_view line);

}  // namespace ptc::cluster
