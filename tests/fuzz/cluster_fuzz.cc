// libFuzzer entry point for what a worker daemon parses from the network and
// from etcd: a peer's HTTP response head, the etcd gateway's JSON answers,
// member records, the job's state (committed, change, failure, part) and a
// durable tier's copy (durable.json). None may crash; an accepted change or
// committed record must round-trip.
// Run: ./cluster_fuzz -max_total_time=60 -max_len=4096 tests/fuzz/corpus/cluster_fuzz
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cluster/durable.h"
#include "cluster/etcd_codec.h"
#include "cluster/http_get.h"
#include "cluster/job_state.h"
#include "cluster/membership.h"
#include "cluster/peer_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  (void)ptc::ParseHttpHead(input, "fuzz");
  (void)ptc::ParsePeerAddress(input);
  (void)ptc::DecodeErrorBody("fuzz", input);
  (void)ptc::DecodeRangeResponse("fuzz", input);
  (void)ptc::DecodeTxnResponse("fuzz", input);
  (void)ptc::DecodeLeaseGrantResponse("fuzz", input);
  (void)ptc::DecodeLeaseKeepAliveResponse("fuzz", input);
  (void)ptc::DecodeWatchMessage("fuzz", input);
  (void)ptc::DecodeMember("fuzz", input);
  (void)ptc::DecodeFailure("fuzz", input);
  (void)ptc::DecodePart("fuzz", input);
  static const std::vector<ptc::TensorRecord> kTensors = {{"layers.0.w", ptc::DType::kBF16, {8, 4}}};
  (void)ptc::DecodeDurable("fuzz", input, {"job", "c0ffee"}, kTensors);
  if (auto c = ptc::DecodeChange("fuzz", input); c.ok()) {
    auto again = ptc::DecodeChange("again", ptc::EncodeChange(*c));
    if (!again.ok() || !(*again == *c)) __builtin_trap();
  }
  if (auto c = ptc::DecodeCommitted("fuzz", input); c.ok()) {
    auto again = ptc::DecodeCommitted("again", ptc::EncodeCommitted(*c));
    if (!again.ok() || !(*again == *c)) __builtin_trap();
  }
  return 0;
}
