// What the distributed optimizer's tests share (dist_optimizer_test, dp_reshardable_save_test).
#pragma once

#include <string>
#include <vector>

namespace ptc::megatron::testing {

// The global names of stage `pp` of 2 of llama with 4 layers (2 each) in the
// local spec's registration order (TransformerLayer's modules, the embedding
// first and the output layer last); the norms by the store's (te) names of
// input_ and pre_mlp_layernorm.
inline std::vector<std::string> LocalOrder(int pp) {
  std::vector<std::string> order;
  if (pp == 0) order.push_back("embedding.word_embeddings.weight");
  for (int i = 2 * pp; i < 2 * pp + 2; ++i) {
    const std::string l = "decoder.layers." + std::to_string(i) + ".";
    for (const char* m : {"self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_proj.weight",
                          "self_attention.linear_qkv.weight", "mlp.linear_fc1.layer_norm_weight",
                          "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"}) {
      order.push_back(l + m);
    }
  }
  if (pp == 1) {
    order.push_back("decoder.final_layernorm.weight");
    order.push_back("output_layer.weight");
  }
  return order;
}

}  // namespace ptc::megatron::testing
