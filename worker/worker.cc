#include "worker/worker.h"

#include <cstdio>
#include <optional>

#include "cluster/rejoin.h"
#include "ptc/store/store.h"
#include "worker/agent.h"
#include "worker/tier_restore.h"

namespace ptcfs::worker {

Worker::Worker(WorkerOptions options, std::unique_ptr<ptc::cluster::KvStore> kv)
    : options_(std::move(options)), kv_(std::move(kv)) {}
Worker::~Worker() = default;

ptc::Result<std::unique_ptr<Worker>> Worker::Prepare(WorkerOptions options, std::unique_ptr<ptc::cluster::KvStore> kv,
                                                     const std::string& store) {
  std::unique_ptr<Worker> w(new Worker(std::move(options), std::move(kv)));
  const WorkerOptions& o = w->options_;
  ptc::cluster::CoordinatorOptions c;
  c.job = o.job;
  c.worker = o.worker;
  c.timeout = o.timeout;
  w->coordinator_ = std::make_unique<ptc::cluster::Coordinator>(w->kv_.get(), c);
  ptc::cluster::PeerEnvOptions env;
  env.self = o.worker;
  env.client.token = o.token;
  env.durable_dir = o.durable.dir;
  env.durable_env = o.durable.env;
  w->env_ = std::make_unique<ptc::cluster::PeerEnv>(o.base != nullptr ? o.base : ptc::Env::Default(), store, env);
  auto opened = ptc::Store::Open(w->env_.get(), store);
  if (!opened.ok() && opened.status().code() == ptc::Code::kNotFound) opened = ptc::Store::Create(w->env_.get(), store);
  PTC_RETURN_IF_ERROR(opened.status());
  ptc::Store& s = **opened;
  // A worker that was away while the job moved on takes the committed generation from a peer first.
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::cluster::Committed> job, w->coordinator_->GetCommitted());
  // Every worker lost (their disks too): the job comes back from its durable tier.
  PTC_ASSIGN_OR_RETURN(const std::optional<TierRestore> restored, RestoreFromTier(o, *w->kv_, *w->coordinator_, job, s));
  if (restored) {
    w->restored_ = restored->generation;
    w->resume_config_ = restored->resume_config;
    w->env_->SetManifests({s.CurrentSnapshot()});
    return w;
  }
  if (job && !ptc::cluster::AtCommitted(s, *job)) {
    PTC_RETURN_IF_ERROR(ptc::cluster::CatchUp(*w->kv_, o.job, o.worker, *job, ptc::cluster::PeerClient(env.client), s));
    std::fprintf(stderr, "ptcfs: worker %d: the store is now at the job's generation %llu (from a peer)\n", o.worker,
                 static_cast<unsigned long long>(job->generation));
  }
  if (!s.has_generation()) {
    return ptc::FailedPreconditionError(store + ": the store holds no generation, and job " + o.job +
                                        " has none committed yet (import into one worker's store first)");
  }
  PTC_RETURN_IF_ERROR(w->coordinator_->Join(s.current()));
  w->env_->SetManifests({s.CurrentSnapshot()});
  return w;
}

ptc::Result<std::shared_ptr<void>> Worker::Attach(Filesystem& fs) {
  auto agent = std::make_shared<Agent>(&fs, options_, kv_.get(), coordinator_.get(), env_.get());
  if (!resume_config_.empty()) agent->ResumeLayout(restored_, resume_config_);
  PTC_RETURN_IF_ERROR(agent->Start());
  return std::shared_ptr<void>(agent);
}

}  // namespace ptcfs::worker
