// libFuzzer entry point for what a worker daemon parses from the network and
// from etcd: a peer's HTTP response head, the etcd gateway's JSON answers,
// member records, the job's state (committed, change, failure, part), a
// change's typed request (change_request.h) and a durable tier's copy
// (durable.json). None may crash; an accepted change, committed record or
// request must round-trip, and so must a request made from the input's bytes
// as a typed value, when valid: decode(encode(x)) == x.
// Run: ./cluster_fuzz -max_total_time=60 -max_len=4096 tests/fuzz/corpus/cluster_fuzz
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "cluster/change_request.h"
#include "cluster/durable.h"
#include "cluster/etcd_codec.h"
#include "cluster/http_get.h"
#include "cluster/job_state.h"
#include "cluster/membership.h"
#include "cluster/peer_protocol.h"

namespace {

// A typed request from the input: its first byte picks the kind, the next
// eight the numbers, the rest the text.
ptc::cluster::ChangeRequest RequestFrom(std::string_view input) {
  const uint8_t kind = input.empty() ? 0 : static_cast<uint8_t>(input[0]);
  uint64_t n = 0;
  for (size_t i = 1; i < 9 && i < input.size(); ++i) n = (n << 8) | static_cast<uint8_t>(input[i]);
  const std::string text(input.substr(std::min<size_t>(input.size(), 9)));
  switch (kind % 4) {
    case 0:
      return ptc::cluster::RelayoutRequest{text};
    case 1:
      return ptc::cluster::SaveRequest{n};
    case 2:
      return ptc::cluster::DcpSaveRequest{static_cast<int>(static_cast<int32_t>(n)), n >> 32, n * 0x9e3779b97f4a7c15,
                                          text};
    default:
      return ptc::cluster::CompactionRequest{(n & 1) != 0};
  }
}

void CheckRequests(std::string_view input) {
  if (auto r = ptc::cluster::DecodeRequest("fuzz", input); r.ok()) {
    if (!ptc::cluster::ValidateRequest(*r).ok()) __builtin_trap();
    auto again = ptc::cluster::DecodeRequest("again", ptc::cluster::EncodeRequest(*r));
    if (!again.ok() || !(*again == *r)) __builtin_trap();
  }
  const ptc::cluster::ChangeRequest typed = RequestFrom(input);
  if (ptc::cluster::ValidateRequest(typed).ok()) {
    auto back = ptc::cluster::DecodeRequest("typed", ptc::cluster::EncodeRequest(typed));
    if (!back.ok() || !(*back == typed)) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  (void)ptc::cluster::ParseHttpHead(input, "fuzz");
  (void)ptc::cluster::ParsePeerAddress(input);
  (void)ptc::cluster::DecodeErrorBody("fuzz", input);
  (void)ptc::cluster::DecodeRangeResponse("fuzz", input);
  (void)ptc::cluster::DecodeTxnResponse("fuzz", input);
  (void)ptc::cluster::DecodeLeaseGrantResponse("fuzz", input);
  (void)ptc::cluster::DecodeLeaseKeepAliveResponse("fuzz", input);
  (void)ptc::cluster::DecodeWatchMessage("fuzz", input);
  (void)ptc::cluster::DecodeMember("fuzz", input);
  (void)ptc::cluster::DecodeFailure("fuzz", input);
  (void)ptc::cluster::DecodePart("fuzz", input);
  {  // a head (the first line) and its chunks (the rest, cut at each later newline)
    const size_t eol = input.find('\n');
    std::map<size_t, std::string> chunks;
    for (size_t at = eol == std::string_view::npos ? input.size() : eol + 1, i = 0; at < input.size(); ++i) {
      const size_t end = std::min(input.find('\n', at), input.size());
      chunks[i] = std::string(input.substr(at, end - at));
      at = end + 1;
    }
    (void)ptc::cluster::DecodePart("fuzz", input.substr(0, eol), chunks);
  }
  static const std::vector<ptc::TensorRecord> kTensors = {{"layers.0.w", ptc::DType::kBF16, {8, 4}}};
  (void)ptc::cluster::DecodeDurable("fuzz", input, {"job", "c0ffee"}, kTensors);
  if (auto c = ptc::cluster::DecodeChange("fuzz", input); c.ok()) {
    auto again = ptc::cluster::DecodeChange("again", ptc::cluster::EncodeChange(*c));
    if (!again.ok() || !(*again == *c)) __builtin_trap();
  }
  CheckRequests(input);
  if (auto c = ptc::cluster::DecodeCommitted("fuzz", input); c.ok()) {
    auto again = ptc::cluster::DecodeCommitted("again", ptc::cluster::EncodeCommitted(*c));
    if (!again.ok() || !(*again == *c)) __builtin_trap();
  }
  return 0;
}
