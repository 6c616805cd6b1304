#include "ptc/dataset/synth.h"

#include <cstring>

#include "ptc/dataset/idx.h"

namespace ptc {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t SampleKey(const SynthDatasetSpec& spec, uint64_t i) { return Mix(Mix(spec.seed) ^ i); }

}  // namespace

uint8_t SynthDTypeCode(const SynthDatasetSpec& spec) { return spec.vocab <= 65536 ? 8 : 4; }

uint64_t SynthLength(const SynthDatasetSpec& spec, uint64_t i) {
  return spec.min_len + SampleKey(spec, i) % (spec.max_len - spec.min_len + 1);
}

std::vector<int64_t> SynthTokens(const SynthDatasetSpec& spec, uint64_t i) {
  std::vector<int64_t> out(SynthLength(spec, i));
  uint64_t state = SampleKey(spec, i) ^ 0x746f6b656e73ULL;
  for (int64_t& t : out) t = static_cast<int64_t>((state = Mix(state)) % spec.vocab);
  return out;
}

Status CheckSynthSpec(const SynthDatasetSpec& spec) {
  if (spec.samples == 0) return InvalidArgumentError("--samples must be at least 1");
  if (spec.min_len > spec.max_len) return InvalidArgumentError("--min-len must not exceed --max-len");
  if (spec.max_len >= (uint64_t{1} << 31)) return InvalidArgumentError("--max-len must be below 2^31 tokens");
  if (spec.vocab < 1 || spec.vocab > (uint64_t{1} << 31)) return InvalidArgumentError("--vocab must be in [1, 2^31]");
  return Status::OK();
}

Status WriteSynthDataset(Env* env, const SynthDatasetSpec& spec, const std::string& prefix,
                         const std::function<void(uint64_t)>& progress) {
  PTC_RETURN_IF_ERROR(CheckSynthSpec(spec));
  const uint8_t code = SynthDTypeCode(spec);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<MegatronWriter> w, MegatronWriter::Create(env, prefix, code, spec.samples));
  std::string bytes;
  for (uint64_t i = 0; i < spec.samples; ++i) {
    const std::vector<int64_t> tokens = SynthTokens(spec, i);
    bytes.resize(tokens.size() * IdxDTypeSize(code));
    for (size_t t = 0; t < tokens.size(); ++t) {
      if (code == 8) {
        const uint16_t v = static_cast<uint16_t>(tokens[t]);
        std::memcpy(&bytes[2 * t], &v, 2);
      } else {
        const int32_t v = static_cast<int32_t>(tokens[t]);
        std::memcpy(&bytes[4 * t], &v, 4);
      }
    }
    PTC_RETURN_IF_ERROR(w->Add(bytes));
    if (progress) progress(bytes.size());
  }
  return w->Finish();
}

}  // namespace ptc
