// PyTorch Distributed Checkpoint (DCP) of a generation: what
// `torch.distributed.checkpoint.load(state_dict, checkpoint_id=DIR)` reads
// with its default FileSystemReader (docs/dcp_format.md):
//
//   DIR/.metadata          a pickle of torch.distributed.checkpoint.metadata.Metadata
//   DIR/__W_0.distcp       the chunks of the pieces stored on worker W, one
//                          after another, each a torch.save file of one tensor
//   DIR/__W_1.distcp       with torchtitan's keys: those that are no whole
//                          stored box (woven heads, a row block's part of a
//                          box: Tensor::blocks), so that __W_0.distcp may be
//                          a rank file (view/rank_files.h)
//
// Chunks are cut where the stored pieces are cut: every box of every stored
// piece, replicas once, so DCP's load planner reads of each chunk only what a
// loading rank needs, at any world size and sharding. The plan is a function
// of the generation's manifest alone, so every worker's mount shows the same
// checkpoint.
//
// Keys (how torch flattens {"model": model.state_dict(), "optim": optimizer
// state by parameter name}):
//   parameter P                 model.P
//   P.exp_avg, P.exp_avg_sq     optim.state.P.exp_avg, optim.state.P.exp_avg_sq
//   P.fp32 (the fp32 master)    optim.state.P.fp32
// or Megatron-Core's (torch_dist) or torchtitan's (below).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/format/torch_file.h"
#include "ptc/model/box.h"
#include "ptc/model/dtype.h"
#include "ptc/model/view.h"
#include "ptc/store/manifest.h"

namespace ptc::dcp {

inline constexpr const char* kMetadataFile = ".metadata";

// How keys are named (see above, and KeyOf).
enum class Keys {
  kTorch,         // model.P, optim.state.P.K: torch's flattening of {"model": ..., "optim": ...}
  kMegatronCore,  // Megatron-Core's sharded state dict (torch_dist): layers stacked, below
  kTorchtitan,    // torchtitan's Llama: its parameter names, q/k rows in its RoPE order (TorchtitanTensors)
};

// A global tensor as the checkpoint holds it. With Keys::kMegatronCore the
// tensors of a layer (decoder.layers.I.X) are slices of one key stacked over
// the layers (decoder.layers.X, shape [layers] + the tensor's), as
// Megatron-Core's sharded state dict puts them; the optimizer state of P is
// optimizer.state.{exp_avg,exp_avg_sq,fp32_param}.<P's key>.
// Rows of a key's tensor taken from rows of its global tensor, `src.size()`
// runs woven row by row: key row dst + k*n + j is row src[j] + k of the
// global tensor (n = src.size(), k < rows / n); the other dims are the same.
struct RowBlock {
  Index dst = 0;
  Index rows = 0;
  std::vector<Index> src;
  friend bool operator==(const RowBlock&, const RowBlock&) = default;
};

struct Tensor {
  std::string name;               // the global tensor
  std::string key;                // its DCP key
  std::vector<std::string> path;  // the key's path in the nested state dict ("optim", "state", P, "exp_avg")
  DType dtype = DType::kF32;
  Shape shape;       // of the global tensor
  Index layer = -1;  // its index along the key's stacked first dim; -1: not stacked
  Index layers = 0;  // the stacked dim's size
  // Empty: the key's tensor is the global tensor. Else its rows are these
  // blocks of the global tensor's (in order, tiling them), and `shape` is the key's.
  std::vector<RowBlock> blocks{};
  // With kMegatronCore, a routed expert's (SequentialMLP's
  // decoder.layers.mlp.experts.experts.X, stacked over layers and experts):
  // its expert along the key's second stacked dim; -1: not an expert's.
  Index expert = -1;
  Index experts = 0;  // that dim's size
};

// Megatron-Core's ChainedOptimizer (a model with routed experts at ep > 1:
// the dense optimizer, then the expert-parallel one) prefixes its optimizers'
// torch_dist keys (ChainedOptimizer.sharded_state_dict, add_prefix_for_sharding,
// as Megatron-LM's metadata and a call without metadata make it):
// chained_0.optimizer.state.K.<P's key> for a dense parameter P,
// chained_1.optimizer.state.K.<P's key> for a routed expert's.
inline constexpr std::string_view kChainedPrefix = "chained_";

// `key` without a ChainedOptimizer prefix (chained_N.), and N (-1: none).
std::pair<std::string_view, int> WithoutChainedPrefix(std::string_view key);

// An MoE layer's own norm (decoder.layers.N.pre_mlp_layernorm.*) has two
// torch_dist keys in megatron-core 0.16.1: the local spec's
// sharded_state_dict_keys_map names it as a dense layer's fused norm
// ("decoder.layers.mlp.linear_fc1.layer_norm_weight", NameTensors' key), the
// TE spec's (get_gpt_layer_with_transformer_engine_spec: a TENorm module of
// its own, no map) keeps "decoder.layers.pre_mlp_layernorm.weight". The TE
// spec's key of `t` (the norm, or its optimizer state, named by NameTensors
// in kMegatronCore); empty for any other tensor.
std::string TeSpecNormKey(const Tensor& t);

// `tensors` (a model's global tensors) with their keys under `keys`; with
// `chained` (kMegatronCore, a model with routed experts at ep > 1) the
// optimizer state's keys prefixed as ChainedOptimizer's (above).
std::vector<Tensor> NameTensors(const std::vector<TensorRecord>& tensors, Keys keys, bool chained = false);

// torchtitan's Llama (torchtitan 0.3, Llama3StateDictAdapter's names) of a
// Megatron-Core GPT model (the built-in llama), its Hugging Face tensors
// (hf::MapModel) renamed:
//   tok_embeddings.weight, norm.weight, lm_head.weight (not when tied),
//   layers.I.attention.qkv_linear.{wq,wk,wv}.weight, layers.I.attention.wo.weight,
//   layers.I.feed_forward.{w1,w2,w3}.weight, layers.I.{attention_norm,ffn_norm}.weight;
// wq and wk in the row order of torchtitan's complex RoPE: per head, key row
// 2i is the head's row i and 2i+1 its row head_dim/2 + i (HF's rotate-half
// order reversed, as the adapter's from_hf permutes them). Adam's moments are
// the optimizer's, by its parameters' names: optimizer.state.<name>.{exp_avg,
// exp_avg_sq}, path ("optimizer", "state.<name>.<kind>") as torchtitan
// flattens its optimizers; its parameters are the model's but for wq, wk and
// wv, which are one fused layers.I.attention.qkv_linear.wqkv.weight (its
// fuse_qkv default): linear_qkv's rows, group-major, q and k heads woven. The
// fp32 masters have no key (torchtitan's parameters are its masters).
// With experts, torchtitan's Qwen3 MoE names (docs/dcp_format.md): each
// layer's experts stacked [experts, ...], the shared experts its
// moe.shared_experts.{w1,w2,w3}.weight (hf::MapOptions).
// \error InvalidArgument naming the schema when it has no Llama names
//        (hf::MapModel's errors), naming the shared experts' gate rule
//        (torchtitan's shared experts have none), or an odd head_dim.
Result<std::vector<Tensor>> TorchtitanTensors(const ModelSpec& spec);

// The key's shape, and where a box of the global tensor is in it.
Shape KeyShape(const Tensor& t);
Box KeyBox(const Tensor& t, const Box& box);

// The boxes of global tensors a chunk of `t` holds: `box` is of the global
// tensor (of the key, for a tensor with blocks), each segment's layout is
// where its elements are in the chunk's dense row-major bytes.
std::vector<Segment> ChunkSegments(const Tensor& t, const Box& box);

struct Chunk {
  size_t tensor = 0;    // index into Plan::tensors (unless `object` >= 0)
  Box box;              // of the global tensor (KeyBox: of the key; of the key's tensor, with blocks)
  uint64_t offset = 0;  // of its torch.save bytes in the file
  uint64_t size = 0;
  int64_t object = -1;  // else: an index into Plan::objects, whose bytes these are
  int64_t flat = -1;    // else: an index into Plan::flats, whose whole tensor this chunk is
};

// An entry that is no stored tensor: its torch.save bytes. With
// kMegatronCore, each layer module's `_extra_state` (Megatron-Core's
// ShardedObject "decoder.layers.M._extra_state/shard_I_L", which its loader
// requires): torch.save([None]), what Megatron-Core saves for a module without
// extra state (Transformer Engine's FP8 state is not rendered here). With
// kTorch and kTorchtitan, Adam's step of each parameter (a 0-dim tensor) and
// the settings of its param group (OptimizerObjects).
struct Object {
  std::string key;
  std::string bytes;
  bool scalar =
      false;  // a 0-dim tensor of `dtype` (TensorStorageMetadata), else a pickled object (BytesStorageMetadata)
  DType dtype = DType::kF32;
  pickle::Items path{};  // in the nested state dict (planner_data); empty: none
  Shape shape{};         // of a scalar tensor with dims: one chunk of it whole (torchtitan's expert_bias_E)
};

struct File {
  std::string name;           // "__W_0.distcp" ("__W_1.distcp": chunks that are no whole stored box)
  int worker = 0;             // whose stored pieces its chunks are
  std::vector<Chunk> chunks;  // by offset
  uint64_t size = 0;
};

// A key whose tensor is a local tensor of its own, one chunk of it whole:
// Megatron-Core's distributed optimizer's flat bucket states
// (ptc/checkpoint/megatron/dist_optimizer.h). Its key is local.name, its
// shape local.shape; elements no segment covers are zeros.
struct FlatTensor {
  LocalTensor local;
};

struct Plan {
  Keys keys = Keys::kTorch;
  std::vector<Tensor> tensors;  // in manifest order
  std::vector<Object> objects;  // their chunks in the first file, after its tensors
  std::vector<FlatTensor> flats{};  // their chunks in a file of their own (AddFlatFile)
  std::vector<File> files;      // by worker, then part
};

// The DCP key of every global tensor of `m`, and where `m`'s stored pieces are.
// \error InvalidArgument naming the tensor when its pieces overlap in a way no
//        disjoint choice of their boxes resolves or leave part of it uncovered,
//        or when a key repeats; with kMegatronCore when the layers of a key
//        differ in shape or dtype or one is missing.
// `chained`: as NameTensors' (the mounted config's ep > 1 for kMegatronCore).
Result<Plan> PlanCheckpoint(const GenerationManifest& m, Keys keys = Keys::kTorch, bool chained = false);

// Disjoint boxes covering what `stored` covers, each with the index of the
// stored box it is part of: a box that does not meet an earlier one is kept
// whole, one already covered is dropped (a replica), and of one partly
// covered the uncovered rest is kept as smaller boxes.
std::vector<std::pair<Box, size_t>> DisjointBoxes(const std::vector<Box>& stored);

// The torch.save file of one chunk: a tensor of `box`'s shape in `dtype`, its
// storage (key "0", CRC 0: as torch writes with
// torch.serialization.set_crc32_options(False)) supplied by the caller.
// \error as PlanTorchFile.
Result<TorchFilePlan> ChunkFile(DType dtype, const Box& box);

// A parameter of the optimizer whose state `tensors` (kTorch or kTorchtitan
// keys) hold: its name in the keys (optim.state.<name>.exp_avg), its global
// tensor (whose step it takes) and Megatron's group of it (1: no weight
// decay, for 1-D parameters and biases).
// A stacked key (torchtitan's experts of a layer, one [experts, ...] tensor)
// is one parameter of its slices' global tensors: `global` the first's,
// `stacked` the others'.
struct OptimizerParam {
  std::string name, global;
  int group = 0;
  std::vector<std::string> stacked{};
};
std::vector<OptimizerParam> OptimizerParams(const std::vector<Tensor>& tensors, Keys keys);

// The optimizer's objects of a kTorch or kTorchtitan plan's tensors (`plan`,
// with optimizer state): each parameter's Adam step (optim.state.P.step;
// optimizer.state.<name>.step), from `meta` (else float32 `iteration`, as the
// Megatron render), and the settings of the param groups: one kept group of
// every parameter, else Megatron's two (`meta`'s, else torch Adam's defaults
// with Megatron's keys; megatron/optimizer.h):
// kTorch: optim.param_groups.G.K and optim.param_groups.G.params (the
// parameters' names) as torch flattens get_optimizer_state_dict's list;
// kTorchtitan: optimizer.param_groups.<name>.K per parameter, as torchtitan
// flattens them. A woven parameter (wq, wk, wv of one linear_qkv) takes its
// global tensor's step and group.
// \error as torch.save's planning.
Result<std::vector<Object>> OptimizerObjects(const std::vector<Tensor>& tensors, Keys keys,
                                             const megatron::OptimizerMeta& meta, uint64_t iteration);

// torch.save of `root` (archive "archive"), its tensors' storages in `storages`.
// \error as PlanTorchFile.
Result<std::string> TorchSaveBytes(const pickle::Value& root,
                                   const std::vector<megatron::CarriedTensor>& storages = {});

// `flats` and `objects` into `plan` as a file of their own, `name` (worker 0).
// \error as torch.save's planning.
Status AddFlatFile(std::string name, std::vector<FlatTensor> flats, std::vector<Object> objects, Plan* plan);

// The .metadata pickle of `plan`.
std::string EncodeMetadata(const Plan& plan);

// Megatron-Core's torch_dist checkpoint directory (`--ckpt-format torch_dist`):
// the DCP files of a Keys::kMegatronCore plan, and these two.
inline constexpr const char* kMcoreMetadataFile = "metadata.json";
inline constexpr const char* kMcoreCommonFile = "common.pt";
// {"sharded_backend": "torch_dist", ...}: how dist_checkpointing.load knows the format.
std::string McoreMetadataJson();
// common.pt, the state dict's entries that are not sharded: a torch.save file
// of {"args": *args (when not null), "checkpoint_version": 3, "iteration": N,
// "optimizer": *optimizer (when not null: McoreOptimizerCommon's, its tensors'
// bytes in `storages`)}.
// \error as PlanTorchFile.
Result<std::string> McoreCommon(uint64_t iteration, const pickle::Value* args, const pickle::Value* optimizer = nullptr,
                                const std::vector<megatron::CarriedTensor>& storages = {});

}  // namespace ptc::dcp
