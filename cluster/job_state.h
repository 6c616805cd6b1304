// The job's shared state in etcd (docs/cluster.md, "Job state"): what is
// committed, the change under way, and each worker's part of it. The JSON
// values of these keys (built in keys.h); pure functions.
//
//   CommittedKey  {"generation":N,"config":"...","digest":"...","contents":"..."}
//   ChangeKey     {"id":"...","from":N,"generation":N+1,"request":"...","workers":[...]}
//                 (request: a ChangeRequest, change_request.h)
//   PartKey       {"id":"...","part":MANIFEST}  worker W wrote its pieces of G (durable)
//   AbortedKey    {"id":"...","error":"..."}   the change to G committed nowhere, and why
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/keys.h"  // the keys these values are kept under
#include "ptc/base/status.h"
#include "ptc/store/manifest.h"

namespace ptc::cluster {

struct Committed {
  uint64_t generation = 0;
  std::string config;
  std::string digest;  // PiecesDigest of the generation
  // The digest of the generation that wrote these tensor bytes (the job's
  // first: a change of layout keeps them): a copy of that generation, in
  // whatever layout, holds this one's bytes (the durable tier, durable.h).
  std::string contents;
  friend bool operator==(const Committed&, const Committed&) = default;
};

struct Change {
  std::string id;  // unique per proposal
  uint64_t from = 0;
  uint64_t generation = 0;  // from + 1
  std::string request;      // what .ptcfs/config was given: every worker applies the same text
  std::vector<int> workers;  // the live members when proposed: each writes its part
  friend bool operator==(const Change&, const Change&) = default;
};

struct Failure {
  std::string id;
  std::string error;
};

std::string EncodeCommitted(const Committed& c);
std::string EncodeChange(const Change& c);
std::string EncodeFailure(const Failure& f);
// A part: the pieces a worker wrote, as a manifest holding their tensors
// (and `extra` as its extra).
std::string EncodePart(std::string_view id, const Part& part, const std::vector<TensorRecord>& tensors);

// A part as etcd values: an encoded part (EncodePart) of at most
// `max_value` bytes is its own head; a larger one is cut into chunks of
// `max_value` bytes (PartChunkKey 0, 1, ...), written before a head that
// names their count, size and checksum:
//   {"id":"...","chunks":N,"bytes":B,"digest":"xxh64 hex"}
struct PartValues {
  std::string head;
  std::vector<std::string> chunks;
};
PartValues CutPart(std::string_view id, std::string encoded, size_t max_value = kMaxEtcdValue);

// Each \error is Corruption naming `where` (the etcd key) and the field at fault.
Result<Committed> DecodeCommitted(std::string_view where, std::string_view value);
Result<Change> DecodeChange(std::string_view where, std::string_view value);
Result<Failure> DecodeFailure(std::string_view where, std::string_view value);
// The part's change id and the part (its shard records validated as a manifest's).
Result<std::pair<std::string, Part>> DecodePart(std::string_view where, std::string_view value);
// The same from a head and its chunks (by index; none for a head holding the
// part itself); Corruption naming `where` and the chunk at fault when one is
// missing or the chunks are not the bytes the head names.
Result<std::pair<std::string, Part>> DecodePart(std::string_view where, std::string_view head,
                                                const std::map<size_t, std::string>& chunks);

// The digest every worker computes of a generation: its config and its
// pieces, in a canonical order (xxh64 hex). Equal on two workers exactly when
// they commit the same generation.
std::string PiecesDigest(std::string_view config, std::vector<ShardRecord> shards);

}  // namespace ptc::cluster
