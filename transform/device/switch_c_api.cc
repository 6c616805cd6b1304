// The C API (switch_c_api.h) over the switch planner and executors. No C++
// exception crosses it: every entry point catches and reports.
#include "transform/device/switch_c_api.h"

#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/base/kv_text.h"
#include "ptc/model/synth.h"
#include "transform/device/cpu_executor.h"
#include "transform/device/cuda_executor.h"
#include "transform/device/switch_plan.h"

struct ptcfs_switch_plan {
  std::shared_ptr<const ptc::transform::device::SwitchPlan> plan;
  ptc::transform::device::SwitchRequest request;
  std::mutex mu;  // guards runners
  std::map<int, std::unique_ptr<ptc::transform::device::CudaSwitchRunner>> runners;
};

namespace {

using ptc::Result;
using ptc::Status;

thread_local std::string g_error;
thread_local std::string g_text;

ptc::transform::device::SwitchPlanCache& Cache() {
  static ptc::transform::device::SwitchPlanCache* cache =
      new ptc::transform::device::SwitchPlanCache();  // never destroyed: used until exit
  return *cache;
}

int Fail(const Status& s) {
  g_error = s.ToString();
  return -1;
}

// Runs `fn` (returning Status), mapping errors and exceptions to -1.
template <typename Fn>
int Guard(Fn&& fn) {
  try {
    Status s = fn();
    return s.ok() ? 0 : Fail(s);
  } catch (const std::exception& e) {
    return Fail(ptc::InternalError(std::string("switch: ") + e.what()));
  } catch (...) {
    return Fail(ptc::InternalError("switch: unknown exception"));
  }
}

Status ParseOptions(const char* text, ptc::transform::device::SwitchRequest* r) {
  if (text == nullptr || *text == '\0') return Status();
  PTC_ASSIGN_OR_RETURN(auto items, ptc::SplitKeyValues(text), "switch options");
  for (const auto& [key, value] : items) {
    if (key == "param_dtype") {
      PTC_ASSIGN_OR_RETURN(r->contents.param_dtype, ptc::ParseDType(value), "switch option param_dtype");
    } else if (key == "grad_dtype") {
      PTC_ASSIGN_OR_RETURN(r->contents.grad_dtype, ptc::ParseDType(value), "switch option grad_dtype");
    } else if (key == "grads" || key == "optimizer") {
      if (value != "0" && value != "1") return ptc::InvalidArgumentError("switch option " + key + ": '" + value + "' is not 0 or 1");
      (key == "grads" ? r->contents.grads : r->contents.optimizer) = value == "1";
    } else if (key == "ranks_per_host") {
      PTC_ASSIGN_OR_RETURN(int64_t n, ptc::ParsePositiveInt(value), "switch option ranks_per_host");
      r->ranks_per_host = static_cast<int>(n);
    } else if (key == "budget") {
      PTC_ASSIGN_OR_RETURN(int64_t n, ptc::ParsePositiveInt(value), "switch option budget");
      r->budget_bytes = static_cast<uint64_t>(n);
    } else {
      return ptc::InvalidArgumentError("switch options: unknown key '" + key +
                                       "' (param_dtype, grad_dtype, grads, optimizer, ranks_per_host, budget)");
    }
  }
  return Status();
}

nlohmann::json BufferJson(const std::vector<ptc::LocalTensor>& list) {
  nlohmann::json out = nlohmann::json::array();
  for (const ptc::LocalTensor& t : list) {
    nlohmann::json segments = nlohmann::json::array();
    for (const ptc::Segment& s : t.segments) {
      segments.push_back({{"tensor", s.tensor},
                          {"begin", s.box.begin},
                          {"end", s.box.end},
                          {"offset", s.layout.offset},
                          {"strides", s.layout.strides}});
    }
    out.push_back({{"name", t.name},
                   {"dtype", std::string(ptc::DTypeName(t.dtype))},
                   {"shape", t.shape},
                   {"bytes", ptc::transform::device::BufferBytes(t)},
                   {"segments", std::move(segments)}});
  }
  return out;
}

Status CheckRank(const ptcfs_switch_plan* p, int rank) {
  if (p == nullptr) return ptc::InvalidArgumentError("switch: null plan");
  if (rank < 0 || rank >= p->plan->world) {
    return ptc::InvalidArgumentError("switch: rank " + std::to_string(rank) + " outside the plan's world of " +
                                     std::to_string(p->plan->world));
  }
  return Status();
}

// Exchanges through the caller's callback.
class CallbackTransport : public ptc::transform::device::SwitchTransport {
 public:
  CallbackTransport(ptcfs_switch_exchange_fn fn, void* ctx) : fn_(fn), ctx_(ctx) {}
  Status Exchange(int rank, std::span<const ptc::transform::device::SwitchMessage> sends,
                  std::span<const ptc::transform::device::SwitchMessage> recvs) override {
    if (sends.empty() && recvs.empty()) return Status();
    std::vector<int> sp, rp;
    std::vector<const void*> sd;
    std::vector<void*> rd;
    std::vector<uint64_t> sb, rb;
    for (const auto& m : sends) sp.push_back(m.peer), sd.push_back(m.data), sb.push_back(m.bytes);
    for (const auto& m : recvs) rp.push_back(m.peer), rd.push_back(m.data), rb.push_back(m.bytes);
    if (fn_(ctx_, static_cast<int>(sp.size()), sp.data(), sd.data(), sb.data(), static_cast<int>(rp.size()),
            rp.data(), rd.data(), rb.data()) != 0) {
      return ptc::IOError("switch: the exchange callback failed on rank " + std::to_string(rank));
    }
    return Status();
  }

 private:
  ptcfs_switch_exchange_fn fn_;
  void* ctx_;
};

}  // namespace

extern "C" {

ptcfs_switch_plan* ptcfs_switch_plan_create(const char* schema, const char* dims, const char* from, const char* to,
                                            const char* options) {
  auto handle = std::make_unique<ptcfs_switch_plan>();
  int rc = Guard([&]() -> Status {
    if (!schema || !dims || !from || !to) return ptc::InvalidArgumentError("switch: schema, dims, from and to are required");
    ptc::transform::device::SwitchRequest& r = handle->request;
    PTC_ASSIGN_OR_RETURN(r.spec.schema, ptc::LoadSchema(schema));
    PTC_ASSIGN_OR_RETURN(r.spec.dims, ptc::ParseDims(dims));
    PTC_ASSIGN_OR_RETURN(r.from, ptc::ParseConfig(from), "layout A");
    PTC_ASSIGN_OR_RETURN(r.to, ptc::ParseConfig(to), "layout B");
    PTC_RETURN_IF_ERROR(ParseOptions(options, &r));
    PTC_ASSIGN_OR_RETURN(handle->plan, Cache().Get(r));
    return Status();
  });
  return rc == 0 ? handle.release() : nullptr;
}

void ptcfs_switch_free(ptcfs_switch_plan* plan) { delete plan; }

int ptcfs_switch_world(const ptcfs_switch_plan* plan) { return plan ? plan->plan->world : -1; }

const char* ptcfs_switch_describe(const ptcfs_switch_plan* p, int rank) {
  int rc = Guard([&]() -> Status {
    if (p == nullptr) return ptc::InvalidArgumentError("switch: null plan");
    const ptc::transform::device::SwitchPlan& plan = *p->plan;
    nlohmann::json j;
    if (rank < 0) {
      j = {{"world", plan.world},          {"buckets", plan.num_buckets},  {"bytes_total", plan.bytes_total},
           {"bytes_local", plan.bytes_local}, {"bytes_moved", plan.bytes_moved}, {"bottleneck", plan.bottleneck},
           {"from", p->request.from.ToString()}, {"to", p->request.to.ToString()}};
      ptc::ModelSpec spec = p->request.spec;
      spec.optimizer = p->request.contents.optimizer;
      PTC_ASSIGN_OR_RETURN(auto globals, ptc::GlobalTensors(spec));
      for (const auto& g : globals) j["tensors"][g.name] = g.shape;
    } else {
      PTC_RETURN_IF_ERROR(CheckRank(p, rank));
      const ptc::transform::device::RankSchedule& rs = plan.ranks[rank];
      j = {{"rank", rank},
           {"from", BufferJson(rs.from)},
           {"to", BufferJson(rs.to)},
           {"staging_bytes", rs.staging_bytes},
           {"buckets", rs.buckets.size()},
           {"bytes_local", rs.bytes_local},
           {"bytes_sent", rs.bytes_sent},
           {"bytes_received", rs.bytes_received}};
    }
    g_text = j.dump();
    return Status();
  });
  return rc == 0 ? g_text.c_str() : nullptr;
}

int ptcfs_switch_synth(const ptcfs_switch_plan* p, int rank, int side, uint64_t seed, void* const* buffers) {
  return Guard([&]() -> Status {
    PTC_RETURN_IF_ERROR(CheckRank(p, rank));
    ptc::ModelSpec spec = p->request.spec;
    spec.optimizer = p->request.contents.optimizer;
    PTC_ASSIGN_OR_RETURN(auto globals, ptc::GlobalTensors(spec));
    std::map<std::string, ptc::Shape> shapes;
    for (const auto& g : globals) shapes[g.name] = shapes[g.name + ".grad"] = g.shape;
    const auto& list = side == 0 ? p->plan->ranks[rank].from : p->plan->ranks[rank].to;
    for (size_t i = 0; i < list.size(); ++i) {
      const ptc::LocalTensor& t = list[i];
      const size_t elem = ptc::DTypeSize(t.dtype);
      for (const ptc::Segment& s : t.segments) {
        auto shape = shapes.find(s.tensor);
        if (shape == shapes.end()) return ptc::InternalError("switch synth: no global tensor " + s.tensor);
        // The box densely, one row (innermost run) at a time, then into place.
        const auto strides = ptc::RowMajorStrides(shape->second);
        const ptc::Index row = s.box.end.back() - s.box.begin.back();
        std::vector<unsigned char> dense(s.box.volume() * elem);
        std::vector<ptc::Index> idx = s.box.begin;
        for (ptc::Index r = 0; r < s.box.volume() / row; ++r) {
          ptc::Index flat = 0;
          for (size_t d = 0; d < idx.size(); ++d) flat += idx[d] * strides[d];
          ptc::SynthValues(s.tensor, seed, t.dtype, flat, row, dense.data() + r * row * elem,
                          p->request.contents.param_dtype);
          for (size_t d = idx.size() - 1; d-- > 0;) {
            if (++idx[d] < s.box.end[d]) break;
            idx[d] = s.box.begin[d];
          }
        }
        ptc::CopyRegion(s.box, dense.data(), s.box, ptc::DenseLayout(s.box), buffers[i], s.box, s.layout, elem);
      }
    }
    return Status();
  });
}

int ptcfs_switch_run(const ptcfs_switch_plan* p, int rank, const void* const* from, void* const* to,
                     ptcfs_switch_exchange_fn exchange, void* ctx) {
  return Guard([&]() -> Status {
    PTC_RETURN_IF_ERROR(CheckRank(p, rank));
    if (exchange == nullptr) return ptc::InvalidArgumentError("switch: no exchange callback");
    const ptc::transform::device::RankSchedule& rs = p->plan->ranks[rank];
    std::vector<const void*> f(from, from + rs.from.size());
    std::vector<void*> t(to, to + rs.to.size());
    CallbackTransport transport(exchange, ctx);
    return ptc::transform::device::RunSwitchCpu(*p->plan, rank, f, t, transport);
  });
}

int ptcfs_switch_run_threads(const ptcfs_switch_plan* p, const void* const* const* from, void* const* const* to) {
  return Guard([&]() -> Status {
    if (p == nullptr) return ptc::InvalidArgumentError("switch: null plan");
    std::vector<std::vector<const void*>> f(p->plan->world);
    std::vector<std::vector<void*>> t(p->plan->world);
    for (int r = 0; r < p->plan->world; ++r) {
      const ptc::transform::device::RankSchedule& rs = p->plan->ranks[r];
      f[r].assign(from[r], from[r] + rs.from.size());
      t[r].assign(to[r], to[r] + rs.to.size());
    }
    return ptc::transform::device::RunSwitchThreads(*p->plan, f, t);
  });
}

int ptcfs_switch_has_cuda(void) { return ptc::transform::device::SwitchHasCuda() ? 1 : 0; }

int ptcfs_switch_run_cuda(const ptcfs_switch_plan* cp, int rank, const void* const* from, void* const* to,
                          void* stream, void* comm) {
  auto* p = const_cast<ptcfs_switch_plan*>(cp);  // the runner cache is the handle's mutable part
  return Guard([&]() -> Status {
    PTC_RETURN_IF_ERROR(CheckRank(p, rank));
    std::lock_guard<std::mutex> lock(p->mu);
    auto& runner = p->runners[rank];
    if (!runner) {
      PTC_ASSIGN_OR_RETURN(runner, ptc::transform::device::CudaSwitchRunner::Create(p->plan, rank));
    }
    const ptc::transform::device::RankSchedule& rs = p->plan->ranks[rank];
    std::vector<const void*> f(from, from + rs.from.size());
    std::vector<void*> t(to, to + rs.to.size());
    return runner->Run(f, t, stream, comm);
  });
}

int ptcfs_switch_nccl_unique_id(char id[128]) {
  return Guard([&] { return ptc::transform::device::NcclUniqueId(id); });
}
int ptcfs_switch_nccl_comm_create(const char id[128], int world, int rank, void** comm) {
  return Guard([&] { return ptc::transform::device::NcclCommCreate(id, world, rank, comm); });
}
int ptcfs_switch_nccl_comm_destroy(void* comm) {
  return Guard([&] { return ptc::transform::device::NcclCommDestroy(comm); });
}

const char* ptcfs_switch_last_error(void) { return g_error.c_str(); }

}  // extern "C"
