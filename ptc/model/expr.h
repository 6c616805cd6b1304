// Integer shape formulas in schemas: "3*hidden", "(heads+2*kv_heads)*head_dim".
// Grammar: sum := product (('+'|'-') product)*; product := atom (('*'|'/') atom)*;
// atom := integer | identifier | '(' sum ')' | '!' atom (1 where the atom is 0,
// else 0: "kv_lora*!q_lora"). Division must be exact.
#pragma once

#include <functional>
#include <optional>
#include <string_view>

#include "ptc/base/status.h"
#include "ptc/model/box.h"

namespace ptc {

using VariableLookup = std::function<std::optional<Index>(std::string_view)>;

// \error InvalidArgument naming the formula: syntax error, unknown name,
//   inexact or zero division, overflow.
Result<Index> EvalExpr(std::string_view formula, const VariableLookup& lookup);

}  // namespace ptc
