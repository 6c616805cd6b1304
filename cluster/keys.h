// Every etcd key of a job, built here and nowhere else (docs/cluster.md,
// "Job state"). Values: job_state.h (committed, change, part, aborted),
// membership.h (members).
//
//   /ptcfs/JOB/                        every key of the job starts with it (a watch of the job)
//   /ptcfs/JOB/members/W               worker W is live (attached to its lease)
//   /ptcfs/JOB/committed               the generation the job committed
//   /ptcfs/JOB/change                  the change under way
//   /ptcfs/JOB/gen/G/part/W            worker W wrote its pieces of G (durable)
//   /ptcfs/JOB/gen/G/part/W/I          part I of worker W's part, when it is cut (job_state.h)
//   /ptcfs/JOB/gen/G/aborted           the change to G committed nowhere, and why
//
// W, G and I are decimal. Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ptc::cluster {

// No value ptcfs puts under these keys is larger (etcd refuses requests over
// 1.5 MiB by default), whatever the number of tensors: a larger one is cut
// (a part: job_state.h CutPart); what grows past it without bound goes
// between the workers (a DCP save's .metadata: change_request.h).
inline constexpr size_t kMaxEtcdValue = size_t{1} << 20;

std::string JobPrefix(std::string_view job);
std::string MembersPrefix(std::string_view job);
std::string MemberKey(std::string_view job, int worker);
std::string CommittedKey(std::string_view job);
std::string ChangeKey(std::string_view job);
std::string GenerationPrefix(std::string_view job, uint64_t generation);
std::string PartsPrefix(std::string_view job, uint64_t generation);
std::string PartKey(std::string_view job, uint64_t generation, int worker);
std::string PartChunkKey(std::string_view job, uint64_t generation, int worker, size_t chunk);
std::string AbortedKey(std::string_view job, uint64_t generation);

// The worker W of a key PartsPrefix(job, generation) + W; nullopt for a key
// under that prefix that names no worker (not decimal, negative, too large).
std::optional<int> PartKeyWorker(std::string_view job, uint64_t generation, std::string_view key);
// The worker and chunk of a key PartChunkKey(job, generation, W, I); nullopt
// for any other key.
std::optional<std::pair<int, size_t>> PartChunkOf(std::string_view job, uint64_t generation, std::string_view key);

}  // namespace ptc::cluster
