#include "cluster/keys.h"

#include <charconv>
#include <type_traits>

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
std::string PartChunkKey(std::string_view job, uint64_t g, int worker, size_t chunk) {
  return PartKey(job, g, worker) + "/" + std::to_string(chunk);
}
std::string AbortedKey(std::string_view job, uint64_t g) { return GenerationPrefix(job, g) + "aborted"; }

namespace {

// The non-negative decimal number `text` is, or nullopt.
template <typename T>
std::optional<T> Decimal(std::string_view text) {
  T v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if constexpr (std::is_signed_v<T>) {
    if (v < 0) return std::nullopt;
  }
  return v;
}

}  // namespace

std::optional<int> PartKeyWorker(std::string_view job, uint64_t generation, std::string_view key) {
  const std::string prefix = PartsPrefix(job, generation);
  if (!key.starts_with(prefix)) return std::nullopt;
  return Decimal<int>(key.substr(prefix.size()));
}

std::optional<std::pair<int, size_t>> PartChunkOf(std::string_view job, uint64_t generation, std::string_view key) {
  const std::string prefix = PartsPrefix(job, generation);
  if (!key.starts_with(prefix)) return std::nullopt;
  const std::string_view name = key.substr(prefix.size());
  const size_t slash = name.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  const std::optional<int> w = Decimal<int>(name.substr(0, slash));
  const std::optional<size_t> i = Decimal<size_t>(name.substr(slash + 1));
  if (!w || !i) return std::nullopt;
  return std::make_pair(*w, *i);
}

}  // namespace ptc::cluster
