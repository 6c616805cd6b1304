// What a change asks of every participant, typed (docs/cluster.md): the kinds
// of change a job runs, and their codec. A change keeps its request in etcd
// as one line of text (Change::request, job_state.h), its first word naming
// the kind:
//
//   CONFIG                        a change of layout: the text written to .ptcfs/config
//                                 ("tp=4,pp=1" or {"config": ..., "step": S}), every worker
//                                 applying the same text (Controller::Apply)
//   save ITERATION                a Megatron save whose latest file was written on the proposer
//   dcp-save WORKER BYTES XXH64 SAVE
//                                 a DCP save: its .metadata (BYTES long, its xxh64 in 16 hex
//                                 digits) published by WORKER's PeerServer as SAVE, its staging
//                                 directory (peer_protocol.h: GET /v1/published?name=SAVE)
//   compact | compact rank-files  a compaction of the committed generation (into rank files)
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "cluster/keys.h"
#include "ptc/base/status.h"

namespace ptc::cluster {

// A change of layout (a reconfigure, a recovery onto the survivors, a copy to
// the replicas): the config text as written to .ptcfs/config, validated by
// the proposer's mount; its first word is none of the other kinds'.
struct RelayoutRequest {
  std::string config;
  friend bool operator==(const RelayoutRequest&, const RelayoutRequest&) = default;
};

// A Megatron save of `iteration`: every worker adds the rank files staged on it.
struct SaveRequest {
  uint64_t iteration = 0;
  friend bool operator==(const SaveRequest&, const SaveRequest&) = default;
};

// The largest .metadata a DCP save may have (DeepSeek-V3's, Adam included, is 164 MiB).
inline constexpr uint64_t kMaxDcpMetadataBytes = uint64_t{1} << 30;

// A DCP save: its .metadata (`bytes`, xxh64 `checksum`) published by worker
// `worker` as `save`, the staging directory (kDcpStaging/NAME, or a torch_dist
// iteration of megatron/), from its proposal until the change ends; every worker
// fetches it from there (not from etcd: it grows with the tensors) and adds the
// chunk files written on it.
struct DcpSaveRequest {
  int worker = 0;
  uint64_t bytes = 0;
  uint64_t checksum = 0;
  std::string save;
  friend bool operator==(const DcpSaveRequest&, const DcpSaveRequest&) = default;
};

// A compaction of the committed generation: every worker rewrites its own
// pieces, all of the same kind (the job's digest covers every piece).
struct CompactionRequest {
  bool rank_files = false;  // into the layout's rank files, else HDF5 files
  friend bool operator==(const CompactionRequest&, const CompactionRequest&) = default;
};

using ChangeRequest = std::variant<RelayoutRequest, SaveRequest, DcpSaveRequest, CompactionRequest>;

// Whether `request` can be encoded and decoded back as it is.
// \error InvalidArgument naming the field at fault: an empty config or one
//        whose first word names another kind; a DCP save's worker < 0, bytes
//        past kMaxDcpMetadataBytes, an empty save.
Status ValidateRequest(const ChangeRequest& request);

// The request's text (above). For a valid `request`,
// DecodeRequest(EncodeRequest(request)) == request.
std::string EncodeRequest(const ChangeRequest& request);

// The request of a change (`where`: the change, for messages).
// \error Corruption naming `where`, the text and the field at fault (a save's
//        "iteration", a DCP save's "worker", "bytes", "checksum" or "save", a
//        compaction's "into"), or as ValidateRequest.
Result<ChangeRequest> DecodeRequest(std::string_view where, std::string_view text);

}  // namespace ptc::cluster
