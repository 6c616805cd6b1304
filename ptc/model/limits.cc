#include "ptc/model/limits.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "ptc/model/rule_layers.h"

namespace ptc {
namespace {

// a * b, or nullopt past 2^64.
std::optional<uint64_t> Mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// "1099511627776 bytes (1.0 TiB)".
std::string Bytes(uint64_t n) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return std::to_string(n) + " bytes (" + buf + ")";
}

}  // namespace

std::string CutForMessage(std::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  return std::string(text.substr(0, max)) + "... (" + std::to_string(text.size() - max) + " bytes cut)";
}

Result<LayoutSize> CheckModelLimits(const ModelSpec& spec) {
  const std::string m = "model dims " + CutForMessage(spec.dims.ToString());
  if (spec.dims.layers > kMaxLayers) {
    return InvalidArgumentError(m + ": layers=" + std::to_string(spec.dims.layers) + " exceeds the limit of " +
                                std::to_string(kMaxLayers) + " layers");
  }
  LayoutSize size;
  for (const TensorRule& rule : spec.schema.rules) {
    if (!rule.tied_to.empty()) continue;  // the same global tensor as its target
    // Per parameter: itself, then exp_avg, exp_avg_sq and fp32 (F32) with Adam; a buffer itself only.
    const bool state = spec.optimizer && HasOptimizerState(rule);
    const uint64_t kinds = state ? 4 : 1;
    const uint64_t state_elem = state ? std::max<uint64_t>(DTypeSize(spec.dtype), 4) : DTypeSize(spec.dtype);
    const uint64_t per_elem = DTypeSize(spec.dtype) + (state ? 12 : 0);
    PTC_ASSIGN_OR_RETURN(const uint64_t count, RuleTensors(rule, spec.dims), m);
    if (count == 0) continue;  // no tensor for these dims (an MoE rule of a dense model, "when")
    PTC_ASSIGN_OR_RETURN(Shape shape, RuleShape(rule, spec.dims), m);
    uint64_t elems = 1;
    for (Index d : shape) {
      auto e = Mul(elems, static_cast<uint64_t>(d));
      if (!e || *e > kMaxTensorBytes) {
        return InvalidArgumentError(m + ": rule '" + CutForMessage(rule.name) + "' has shape " +
                                    CutForMessage(ShapeToString(shape)) + ", more than the limit of " +
                                    Bytes(kMaxTensorBytes) + " per tensor");
      }
      elems = *e;
    }
    const uint64_t bytes = elems * state_elem;  // elems <= 2^40, state_elem <= 8
    if (bytes > kMaxTensorBytes) {
      return InvalidArgumentError(m + ": rule '" + CutForMessage(rule.name) + "' has shape " + ShapeToString(shape) +
                                  ", a tensor of " + Bytes(bytes) + ", more than the limit of " +
                                  Bytes(kMaxTensorBytes) + " per tensor");
    }
    if (bytes > size.largest_tensor) size.largest_tensor = bytes, size.largest_name = rule.name;
    size.tensors += count * kinds;  // count <= 2^14 layers * 2^14 experts: no overflow
    // count * elems * per_elem could pass 2^64 (2^28 * 2^40 * 14): checked in steps.
    auto bytes_of_rule = Mul(count, elems);
    if (bytes_of_rule) bytes_of_rule = Mul(*bytes_of_rule, per_elem);
    if (!bytes_of_rule || *bytes_of_rule > kMaxModelBytes) {
      return InvalidArgumentError(m + ": the model's tensors hold more than the limit of " + Bytes(kMaxModelBytes));
    }
    size.model_bytes += *bytes_of_rule;
    if (size.model_bytes > kMaxModelBytes) {
      return InvalidArgumentError(m + ": the model's tensors hold more than the limit of " + Bytes(kMaxModelBytes));
    }
  }
  if (size.tensors > kMaxTensors) {
    return InvalidArgumentError(m + ": the model has " + std::to_string(size.tensors) +
                                " tensors (optimizer state included), more than the limit of " +
                                std::to_string(kMaxTensors));
  }
  return size;
}

Status CheckLayoutLimits(const ModelSpec& spec, const ParallelConfig& config) {
  const std::string c = "config " + CutForMessage(config.ToString());
  const int64_t ranks = int64_t{config.tp} * config.pp * config.dp * config.cp;
  if (ranks > kMaxRanks) {
    return InvalidArgumentError(c + ": " + (config.cp == 1 ? "tp*pp*dp" : "tp*cp*pp*dp") + " = " +
                                std::to_string(ranks) + " ranks exceeds the limit of " + std::to_string(kMaxRanks) +
                                " ranks");
  }
  PTC_ASSIGN_OR_RETURN(LayoutSize size, CheckModelLimits(spec));
  // The fullest rank: every first- and last-stage placement plus the layers of
  // the longest stage (each expert rule with the experts of one ep rank), with
  // per-parameter optimizer state, or ZeRO-1's flat pieces (3 dense, 3 expert).
  Index stage_layers = config.pp >= 1 ? spec.dims.layers / config.pp : spec.dims.layers;
  for (int n : config.pp_layers) stage_layers = std::max<Index>(stage_layers, n);
  stage_layers = std::min(stage_layers, spec.dims.layers);
  const bool zero = spec.optimizer && config.zero;
  const uint64_t rank_experts =
      spec.dims.experts > 0 && config.ep > 0 ? static_cast<uint64_t>(spec.dims.experts / config.ep) : 0;
  uint64_t stage_rules = 0, layer_rules = 0;  // local tensors per stage and per layer, optimizer state included
  for (const TensorRule& rule : spec.schema.rules) {
    if (const Result<bool> when = RuleWhen(rule, spec.dims); when.ok() && !*when) continue;  // no tensor (MLA's, ...)
    const uint64_t kinds = spec.optimizer && !zero && HasOptimizerState(rule) ? 4 : 1;
    if (rule.pp != PpPlacement::kLayer) stage_rules += kinds;
    else layer_rules += (rule.expert ? rank_experts : 1) * kinds;
  }
  const uint64_t per_rank = stage_rules + layer_rules * static_cast<uint64_t>(stage_layers) + (zero ? 6 : 0);
  const uint64_t layout = per_rank * static_cast<uint64_t>(ranks);  // <= 2^20 * 2^16
  if (layout > kMaxLayoutTensors) {
    return InvalidArgumentError(c + ": " + std::to_string(ranks) + " ranks x " + std::to_string(per_rank) +
                                " local tensors = " + std::to_string(layout) + " exceeds the limit of " +
                                std::to_string(kMaxLayoutTensors) + " local tensors in a layout");
  }
  return Status::OK();
}

Status CheckFilesWritten(uint64_t files, const std::string& what) {
  if (files <= kMaxFilesWritten) return Status::OK();
  return InvalidArgumentError(what + ": would write " + std::to_string(files) + " files, more than the limit of " +
                              std::to_string(kMaxFilesWritten) + " files");
}

Status CheckHeldBytes(uint64_t bytes, uint64_t memory, const std::string& what) {
  if (memory == 0 || bytes <= memory) return Status::OK();
  return InvalidArgumentError(what + " of " + Bytes(bytes) + " exceeds this machine's memory of " + Bytes(memory));
}

}  // namespace ptc
