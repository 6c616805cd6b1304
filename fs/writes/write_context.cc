// The store's writer role that every write takes in turn, and the status it
// reports.
#include "fs/writes/write_context.h"

#include <utility>

namespace ptcfs {

WriteContext::WriteContext(ptc::Store* store, int worker, int threads, CompactionPolicy compaction,
                           std::shared_ptr<ShardChecks> checks, std::shared_ptr<const ptc::DatasetSource> source,
                           std::function<void(std::shared_ptr<const Snapshot>)> serve,
                           std::function<ptc::Status()> collect)
    : store_(store),
      worker_(worker),
      threads_(threads),
      compaction_(compaction),
      checks_(std::move(checks)),
      source_(std::move(source)),
      serve_(std::move(serve)),
      collect_(std::move(collect)) {}

WriteContext::~WriteContext() { Stop(); }

void WriteContext::Stop() {
  std::thread t;
  {
    ptc::MutexLock lock(&mu_);
    t = std::move(background_);
  }
  JoinBackground(std::move(t));
}

ptc::Result<std::shared_ptr<const Snapshot>> WriteContext::MakeSnapshot(
    std::shared_ptr<const ptc::GenerationManifest> generation, ptc::ModelLayout layout,
    std::optional<ptc::DatasetState> dataset) const {
  return Snapshot::Create(*store_, std::move(generation), std::move(layout), worker_, checks_, std::move(dataset),
                          source_);
}

ptc::Result<std::shared_ptr<const Snapshot>> WriteContext::MakeSnapshot(ptc::ModelLayout layout,
                                                                        std::optional<ptc::DatasetState> dataset) const {
  return MakeSnapshot(store_->CurrentSnapshot(), std::move(layout), std::move(dataset));
}

ptc::Result<MountState> WriteContext::BeginWriting(MountState state, const std::string& busy) {
  MountState before;
  std::thread previous;
  {
    ptc::MutexLock lock(&mu_);
    if (status_.writing()) return ptc::FailedPreconditionError(busy);
    before = status_.state;
    status_.state = state;
    if (state == MountState::kRepartitioning) {
      status_.last_error.clear();
      progress_.done = 0;
      progress_.total = 0;
    }
    previous = std::move(background_);
  }
  JoinBackground(std::move(previous));    // a finished rewrite, perhaps still removing what it replaced or compacting
  { ptc::MutexLock wait(&collect_mu_); }  // a removal after a close (Collect) ends before the writer writes
  return before;
}

void WriteContext::EndWriting(const ptc::Status& result, MountState on_error, const std::string& what) {
  ptc::MutexLock lock(&mu_);
  status_.state = result.ok() ? MountState::kServing : on_error;
  if (!result.ok()) status_.SetLastError(what + result.message());
}

ptc::Status WriteContext::RunHere(MountState state, const std::string& busy, const std::string& what,
                                  const std::function<ptc::Status()>& write) {
  PTC_ASSIGN_OR_RETURN(const MountState before, BeginWriting(state, busy));
  const ptc::Status result = write();
  EndWriting(result, before, what);
  return result;
}

ptc::Status WriteContext::RunInBackground(MountState state, const std::string& busy, const std::string& what,
                                          std::shared_ptr<AgreedChange> change,
                                          std::function<ptc::Status(AgreedChange&)> write,
                                          std::function<void(bool ok)> after) {
  auto started = BeginWriting(state, busy);
  if (!started.ok()) {  // `after` is not called
    change->Failed(started.status());
    RecordError(what + started.status().message());
    return started.status();
  }
  StartBackground([this, what, change = std::move(change), write = std::move(write), after = std::move(after)] {
    const ptc::Status result = write(*change);
    if (!result.ok()) change->Failed(result);
    after(result.ok());
    EndWriting(result, MountState::kFailed, what);
  });
  return ptc::Status::OK();
}

void WriteContext::StartBackground(std::function<void()> write) {
  ptc::MutexLock lock(&mu_);
  background_ = std::thread(std::move(write));
}

void WriteContext::Commit(const std::shared_ptr<const Snapshot>& snap) {
  serve_(snap);
  {
    ptc::MutexLock lock(&mu_);
    status_.last_error.clear();  // committed
  }
  Collect();
}

void WriteContext::Collect(bool only_when_idle) {
  ptc::Status s;
  {
    ptc::MutexLock lock(&collect_mu_);
    if (only_when_idle) {
      ptc::MutexLock state(&mu_);
      // A running rewrite, save or compaction collects after its commit.
      if (status_.writing() || status_.compaction == CompactionState::kRunning) return;
    }
    s = collect_();
  }
  if (!s.ok()) RecordError("removing replaced generations: " + s.message());
}

void WriteContext::JoinBackground(std::thread previous) {
  cancel_compaction_ = true;
  std::shared_ptr<AgreedChange> compacting;
  {
    ptc::MutexLock lock(&mu_);
    compacting = compacting_;
  }
  // A compaction of the job may wait for the others' parts: its change is
  // aborted everywhere (when it still stands), which ends that wait.
  if (compacting) {
    compacting->Failed(ptc::FailedPreconditionError(std::string(kCompactionGivesWay) + "a change on worker " +
                                                    std::to_string(worker_)));
  }
  if (previous.joinable()) previous.join();
  cancel_compaction_ = false;
}

bool WriteContext::StartCompaction(std::shared_ptr<AgreedChange> change, std::function<void()> compact) {
  ptc::MutexLock lock(&mu_);
  if (status_.writing() || compacting_ != nullptr) return false;
  compacting_ = std::move(change);
  status_.compaction = CompactionState::kRunning;
  status_.compaction_why.clear();
  compaction_progress_.done = 0;
  compaction_progress_.total = 0;
  cancel_compaction_ = false;  // no writer joins the background thread now (none holds the role)
  // The thread joins the one before (a finished change, perhaps still
  // removing what it replaced); a writer that starts meanwhile joins it.
  background_ = std::thread([this, compact = std::move(compact), previous = std::move(background_)]() mutable {
    if (previous.joinable()) previous.join();
    compact();
    ptc::MutexLock lock(&mu_);
    compacting_.reset();
  });
  return true;
}

void WriteContext::CancelCompaction() {
  ptc::MutexLock lock(&mu_);
  if (compacting_) cancel_compaction_ = true;
}

bool WriteContext::Busy() const {
  ptc::MutexLock lock(&mu_);
  return status_.writing() || compacting_ != nullptr;
}

void WriteContext::Update(const std::function<void(MountStatus&)>& update) {
  ptc::MutexLock lock(&mu_);
  update(status_);
}

void WriteContext::RecordError(const std::string& error) {
  ptc::MutexLock lock(&mu_);
  status_.SetLastError(error);
}

void WriteContext::Read(const std::function<void(const MountStatus&, const JobParticipant*)>& read) const {
  ptc::MutexLock lock(&mu_);
  read(status_, job_);
}

JobParticipant* WriteContext::job() const {
  ptc::MutexLock lock(&mu_);
  return job_;
}

void WriteContext::SetJob(JobParticipant* job) {
  ptc::MutexLock lock(&mu_);
  job_ = job;
}

}  // namespace ptcfs
