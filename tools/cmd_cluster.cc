// ptcfs cluster status: a job's state across its workers (docs/cluster.md,
// "Lost workers"): etcd's committed generation and change, the members and
// their leases, the replicas of each worker's pieces, and what the loss of
// each worker would cost. `--json` output is documented in docs/cli.md.
#include <cstdio>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "cluster/coordinator.h"
#include "cluster/durable.h"
#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "cluster/peer_client.h"
#include "cluster/rejoin.h"
#include "cluster/token.h"
#include "ptc/base/json_fields.h"
#include "ptc/store/model_spec.h"
#include "tools/cluster_mount.h"
#include "worker/job_report.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace ptcfs {
namespace {

struct ClusterStatusArgs {
  std::string url;
  std::string token_file;
  std::string durable;  // the job's durable tier; empty: not asked
  bool json = false;
};

ptc::Result<nlohmann::json> Gather(const ClusterStatusArgs& a) {
  PTC_ASSIGN_OR_RETURN(ClusterUrl url, ParseClusterUrl(a.url));
  ptc::cluster::EtcdOptions eo;
  eo.endpoints = url.endpoints;
  PTC_ASSIGN_OR_RETURN(auto etcd, ptc::cluster::EtcdClient::Create(eo));
  PTC_RETURN_IF_ERROR(etcd->Health(), a.url);
  nlohmann::json j = {{"job", url.job}, {"etcd", url.endpoints}, {"committed", nullptr}, {"change", nullptr}};
  ptc::cluster::Coordinator coordinator(etcd.get(), {url.job, -1});
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::cluster::Committed> committed, coordinator.GetCommitted());
  if (committed) {
    j["committed"] = {{"generation", committed->generation},
                      {"config", committed->config},
                      {"digest", committed->digest}};
  }
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::cluster::Change> change, coordinator.Pending());
  if (change) {
    j["change"] = {{"generation", change->generation}, {"request", change->request}, {"workers", change->workers}};
  }
  // The members with their leases (the keys' lease ids).
  PTC_ASSIGN_OR_RETURN(ptc::cluster::RangeResponse keys, etcd->GetPrefix(ptc::cluster::MembersPrefix(url.job)));
  std::map<int, nlohmann::json> workers;
  std::vector<int> live;
  for (const ptc::cluster::KeyValue& kv : keys.kvs) {
    PTC_ASSIGN_OR_RETURN(ptc::cluster::Member m, ptc::cluster::DecodeMember("etcd key " + kv.key, kv.value));
    auto ttl = etcd->LeaseTimeToLive(kv.lease);
    workers[m.worker] = {{"worker", m.worker},
                         {"live", true},
                         {"address", m.address},
                         {"lease_ttl_seconds", ttl.ok() ? nlohmann::json(*ttl) : nlohmann::json(nullptr)}};
    live.push_back(m.worker);
  }
  if (!committed) {
    for (auto& [w, wj] : workers) j["workers"].push_back(wj);
    return j;
  }
  // The committed generation's pieces, from the first live worker that serves it.
  PTC_ASSIGN_OR_RETURN(std::string token, ptc::cluster::ReadTokenFile(a.token_file));
  ptc::cluster::PeerClientOptions po;
  po.token = token;
  PTC_ASSIGN_OR_RETURN(
      ptc::GenerationManifest manifest,
      ptc::cluster::FetchCommitted(*etcd, url.job, /*skip=*/-1, *committed, ptc::cluster::PeerClient(po)));
  PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecFromManifest(manifest));
  PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig config, ptc::ConfigFromManifest(manifest));
  const std::map<int, worker::WorkerPieces> held = worker::PiecesByWorker(manifest);
  // The durable tier's copy, when asked about.
  std::optional<std::vector<ptc::ShardRecord>> durable;
  if (!a.durable.empty()) {
    PTC_ASSIGN_OR_RETURN(ptc::cluster::DurableLocation tier, ptc::cluster::OpenDurableLocation(a.durable, /*create=*/false), "--durable");
    auto copy = ptc::cluster::LoadDurable(tier.get(), tier.dir, {url.job, committed->contents}, manifest.tensors);
    j["durable"] = {{"dir", tier.name}, {"copy", copy.ok()}};
    if (copy.ok()) {
      durable = std::move(*copy);
    } else {
      j["durable"]["error"] = copy.status().message();
    }
  }
  std::set<int> all(live.begin(), live.end());
  for (const auto& [w, v] : held) all.insert(w);
  for (int w : config.Workers()) all.insert(w);
  j["workers"] = nlohmann::json::array();
  for (int w : all) {
    nlohmann::json wj = workers.count(w) ? workers[w] : nlohmann::json{{"worker", w}, {"live", false}};
    auto it = held.find(w);
    wj.update(worker::PiecesJson(it == held.end() ? worker::WorkerPieces{} : it->second));
    wj["if_lost"] = worker::IfLost(manifest, spec, config, live, w, durable ? &*durable : nullptr);
    j["workers"].push_back(wj);
  }
  return j;
}

// A string of the job's etcd records (a member's address, an error naming
// one), printed so that no byte of it can steer the terminal.
std::string Text(const nlohmann::json& v) { return ptc::Printable(v.get<std::string>()); }

void PrintText(const nlohmann::json& j) {
  std::printf("job %s\n", Text(j["job"]).c_str());
  if (j["committed"].is_null()) {
    std::printf("nothing committed yet\n");
  } else {
    std::printf("committed: generation %llu, %s\n",
                static_cast<unsigned long long>(j["committed"]["generation"].get<uint64_t>()),
                Text(j["committed"]["config"]).c_str());
  }
  if (j["change"].is_null()) {
    std::printf("no change under way\n");
  } else {
    std::printf("change under way to generation %llu: %s\n",
                static_cast<unsigned long long>(j["change"]["generation"].get<uint64_t>()),
                Text(j["change"]["request"]).c_str());
  }
  if (!j.contains("workers")) return;
  if (j.contains("durable")) {
    const nlohmann::json& d = j["durable"];
    std::printf("durable tier %s: %s\n", Text(d["dir"]).c_str(),
                d["copy"].get<bool>() ? "holds a copy of the job's tensors" : Text(d["error"]).c_str());
  }
  for (const nlohmann::json& w : j["workers"]) {
    std::string lease = !w.value("live", false) ? "not live"
                        : w["lease_ttl_seconds"].is_number()
                            ? "lease " + std::to_string(w["lease_ttl_seconds"].get<int64_t>()) + " s left"
                            : "lease ?";
    const std::string address = ptc::Printable(w.value("address", std::string("-")));
    std::printf("worker %d  %s  %s", w["worker"].get<int>(), address.c_str(),
                lease.c_str());
    if (!w.contains("pieces")) {
      std::printf("\n");
      continue;
    }
    std::printf("  %llu pieces, %s", static_cast<unsigned long long>(w["pieces"].get<uint64_t>()),
                HumanBytes(w["bytes"].get<uint64_t>()).c_str());
    std::string copies;
    for (const auto& [other, bytes] : w["replicas"].items()) {
      copies += (copies.empty() ? "" : ", ") + HumanBytes(bytes.get<uint64_t>()) + " on worker " + other;
    }
    std::printf("; copies of its pieces: %s\n", copies.empty() ? "none" : copies.c_str());
    const nlohmann::json& lost = w["if_lost"];
    if (!lost["holds_ranks"].get<bool>()) {
      std::printf("  if lost: holds no ranks; nothing to do\n");
    } else if (lost.contains("error")) {
      std::printf("  if lost: %s\n", Text(lost["error"]).c_str());
    } else if (lost.contains("from_durable")) {
      std::printf("  if lost: %zu tensors only on it, restored from the durable tier (%s read from it); the survivors "
                  "move to %s (%s moved)\n",
                  lost["lost_tensors"].size(), HumanBytes(lost["from_durable"].get<uint64_t>()).c_str(),
                  Text(lost["config"]).c_str(), HumanBytes(lost["bytes_moved"].get<uint64_t>()).c_str());
    } else if (!lost["lost_tensors"].empty()) {
      std::printf("  if lost: %zu tensors lost (first: %s); nothing would be committed\n", lost["lost_tensors"].size(),
                  Text(lost["lost_tensors"][0]).c_str());
    } else {
      std::printf("  if lost: nothing lost; the survivors move to %s (%s moved)\n",
                  Text(lost["config"]).c_str(), HumanBytes(lost["bytes_moved"].get<uint64_t>()).c_str());
    }
  }
}

ptc::Status RunClusterStatus(const ClusterStatusArgs& a) {
  PTC_ASSIGN_OR_RETURN(nlohmann::json j, Gather(a));
  if (a.json) {
    std::printf("%s\n", ptc::JsonText(j, 2).c_str());
  } else {
    PrintText(j);
  }
  return ptc::Status::OK();
}

}  // namespace

void AddClusterCommand(CLI::App& app, int* exit_code) {
  CLI::App* cluster = app.add_subcommand("cluster", "A job of many workers (docs/cluster.md).");
  cluster->require_subcommand(1);
  auto a = std::make_shared<ClusterStatusArgs>();
  CLI::App* status = cluster->add_subcommand(
      "status",
      "Show a job's state across its workers: the committed generation and any change under way\n"
      "(from etcd), each member's address and lease, the pieces each worker holds and which other\n"
      "workers hold copies of them, and what losing each worker would cost: the config the\n"
      "survivors would move to and the bytes it moves, or the tensors no survivor holds (and,\n"
      "with --durable, whether the durable tier restores them).");
  status->add_option("--cluster", a->url, "etcd://HOST:PORT[,HOST:PORT...]/JOB")->required();
  status->add_option("--token-file", a->token_file, "the job's shared token: the pieces come from a live worker")
      ->required();
  status->add_option("--durable", a->durable,
                     "DIR: the job's durable tier (the workers' --durable): whether it holds a copy, and\n"
                     "what a loss would read from it");
  status->add_flag("--json", a->json, "machine-readable output (fields documented in docs/cli.md)");
  status->callback([a, exit_code] { *exit_code = Report("cluster status", RunClusterStatus(*a)); });
}

}  // namespace ptcfs
