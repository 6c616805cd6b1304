#include "tools/cluster_mount.h"

#include <chrono>
#include <filesystem>

#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "cluster/token.h"

namespace ptcfs {

ptc::Result<ClusterUrl> ParseClusterUrl(std::string_view text) {
  auto bad = [&] {
    return ptc::InvalidArgumentError("--cluster '" + std::string(text) +
                                     "': expected etcd://HOST:PORT[,HOST:PORT...]/JOB");
  };
  constexpr std::string_view kScheme = "etcd://";
  if (!text.starts_with(kScheme)) return bad();
  std::string_view rest = text.substr(kScheme.size());
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return bad();
  ClusterUrl url;
  url.job = std::string(rest.substr(slash + 1));
  PTC_RETURN_IF_ERROR(ptc::cluster::ValidateJobName(url.job));
  std::string_view hosts = rest.substr(0, slash);
  while (!hosts.empty()) {
    const size_t comma = hosts.find(',');
    std::string_view h = hosts.substr(0, comma);
    if (!ptc::cluster::ParsePeerAddress(h).ok()) return bad();
    url.endpoints.emplace_back(h);
    hosts = comma == std::string_view::npos ? std::string_view() : hosts.substr(comma + 1);
  }
  if (url.endpoints.empty()) return bad();
  return url;
}

ptc::Result<std::unique_ptr<worker::Worker>> PrepareClusterWorker(const ClusterArgs& args, const std::string& store,
                                                                  int worker) {
  if (worker < 0) return ptc::InvalidArgumentError("--cluster needs --worker: this mount's worker id");
  worker::WorkerOptions o;
  o.worker = worker;
  PTC_ASSIGN_OR_RETURN(ClusterUrl url, ParseClusterUrl(args.url));
  o.job = url.job;
  PTC_ASSIGN_OR_RETURN(o.listen, ptc::cluster::ParsePeerAddress(args.listen), "--listen");
  if (o.listen.host == "0.0.0.0" || o.listen.host == "::") {
    return ptc::InvalidArgumentError("--listen " + args.listen +
                                     ": give the address the other workers reach this one at, not a wildcard");
  }
  if (!args.durable.empty()) {
    PTC_ASSIGN_OR_RETURN(o.durable, ptc::cluster::OpenDurableLocation(args.durable), "--durable");
  }
  if (args.token_file.empty()) return ptc::InvalidArgumentError("--cluster needs --token-file: the job's shared token");
  PTC_ASSIGN_OR_RETURN(o.token, ptc::cluster::ReadTokenFile(args.token_file));
  o.lease_seconds = args.lease_seconds;
  o.timeout = std::chrono::seconds(args.timeout_seconds);
  ptc::cluster::EtcdOptions etcd;
  etcd.endpoints = url.endpoints;
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::cluster::EtcdClient> client, ptc::cluster::EtcdClient::Create(etcd));
  PTC_RETURN_IF_ERROR(client->Health(), "--cluster " + args.url);
  return worker::Worker::Prepare(std::move(o), std::move(client), store);
}

}  // namespace ptcfs
