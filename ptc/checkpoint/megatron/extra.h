// Megatron-Core's `*._extra_state` entries of a rank's model dict (a linear's,
// an attention's: Transformer Engine's FP8 metadata as a torch.save'd
// io.BytesIO or a tensor, None with the local spec), kept per saved tp rank as
// opaque values and rendered back into the model dict of every rank that holds
// their module (docs/megatron_format.md, "Extra state").
//
// An entry is named globally: the layer number in its key is the global one,
// as the schema's tensors are, so a save at pp=2 renders at pp=1 and back. Its
// anchor is the schema tensor of the saving rank whose name shares the most
// leading components with the key (linear_qkv._extra_state: linear_qkv.weight;
// core_attention._extra_state: a tensor of its layer); a rank renders the
// entries whose anchor it holds, from the saved tp rank tp mod the saved tp.
// A module holding several routed experts (TEGroupedMLP's linear_fc1 and
// linear_fc2, `decoder.layers.N.mlp.experts.linear_fc1._extra_state`: the key
// names no expert) is kept per saving ep rank, anchored at its first expert,
// its layer number global (the layer of its tensors: the names' tails differ,
// `weightK` and `local_experts.K....weight`); a rank renders the one of the
// saved ep rank that held the rank's first expert of that layer.
// They are kept in the manifest with the other carried state (megatron.h).
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/model/view.h"

namespace ptc::megatron {

// "x._extra_state" or "_extra_state".
bool IsExtraStateKey(std::string_view key);

// The global name of the entry `local_key` of `view`'s model dict and its anchor
// (the global name of a tensor of the view). REQUIRES: !view.model.empty().
struct ExtraName {
  std::string key, anchor;
};
ExtraName GlobalExtraName(const RankView& view, std::string_view local_key);

// The kept entries `view`'s rank renders: its local key, where it goes (after
// view.model[after], the last tensor of the nearest module, in the model dict;
// an entry of that tensor's own module before one of an enclosing module's) and
// the entry, in the order of the dict; the first of a local key wins. Empty
// when none are kept.
struct PlacedExtra {
  std::string local_key;
  size_t after = 0;
  const ExtraEntry* entry = nullptr;
};
std::vector<PlacedExtra> PlaceExtras(const MegatronState& state, const RankView& view);

}  // namespace ptc::megatron
