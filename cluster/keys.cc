#include "cluster/keys.h"

#include <charconv>

namespace ptc::cluster {

std::string JobPrefix(std::string_view job) { return "/ptcfs/" + std::string(job) + "/"; }
std::string MembersPrefix(std::string_view job) { return JobPrefix(job) + "members/"; }
std::string MemberKey(std::string_view job, int worker) { return MembersPrefix(job) + std::to_string(worker); }
std::string CommittedKey(std::string_view job) { return JobPrefix(job) + "committed"; }
std::string ChangeKey(std::string_view job) { return JobPrefix(job) + "change"; }
std::string GenerationPrefix(std::string_view job, uint64_t g) {
  return JobPrefix(job) + "gen/" + std::to_string(g) + "/";
}
std::string PartsPrefix(std::string_view job, uint64_t g) { return GenerationPrefix(job, g) + "part/"; }
std::string PartKey(std::string_view job, uint64_t g, int worker) {
  return PartsPrefix(job, g) + std::to_string(worker);
}
std::string AbortedKey(std::string_view job, uint64_t g) { return GenerationPrefix(job, g) + "aborted"; }
std::string DcpMetadataPrefix(std::string_view job, int worker) {
  return JobPrefix(job) + "dcp-metadata/" + std::to_string(worker) + "/";
}
std::string DcpMetadataKey(std::string_view job, int worker, size_t part) {
  return DcpMetadataPrefix(job, worker) + std::to_string(part);
}

std::optional<int> PartKeyWorker(std::string_view job, uint64_t generation, std::string_view key) {
  const std::string prefix = PartsPrefix(job, generation);
  if (!key.starts_with(prefix)) return std::nullopt;
  const std::string_view name = key.substr(prefix.size());
  int w = -1;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), w);
  if (ec != std::errc() || end != name.data() + name.size() || w < 0) return std::nullopt;
  return w;
}

}  // namespace ptc::cluster
