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
  static const std::vector<ptc::TensorRecord> kTensors = {{"layers.0.w", ptc::DType::kBF16, {8, 4}}};
  (void)ptc::cluster::DecodeDurable("fuzz", input, {"job", "c0ffee"}, kTensors);
  if (auto c = ptc::cluster::DecodeChange("fuzz", input); c.ok()) {
    auto again = ptc::cluster::DecodeChange("again", ptc::cluster::EncodeChange(*c));
    if (!again.ok() || !(*again == *c)) __builtin_trap();
  }
  if (auto c = ptc::cluster::DecodeCommitted("fuzz", input); c.ok()) {
    auto again = ptc::cluster::DecodeCommitted("again", ptc::cluster::EncodeCommitted(*c));
    if (!again.ok() || !(*again == *c)) __builtin_trap();
  }
  return 0;
}
