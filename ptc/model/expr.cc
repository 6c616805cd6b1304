#include "ptc/model/expr.h"

#include <cctype>
#include <string>

namespace ptc {
namespace {

class Parser {
 public:
  Parser(std::string_view text, const VariableLookup& lookup) : text_(text), lookup_(lookup) {}

  Result<Index> Parse() {
    PTC_ASSIGN_OR_RETURN(Index v, Sum());
    Skip();
    if (pos_ != text_.size()) return Error("unexpected '" + std::string(1, text_[pos_]) + "'");
    return v;
  }

 private:
  Status Error(const std::string& why) const {
    return InvalidArgumentError("formula '" + Abbreviate(text_) + "': " + why);
  }
  void Skip() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Eat(char c) {
    Skip();
    if (pos_ < text_.size() && text_[pos_] == c) return ++pos_, true;
    return false;
  }
  Result<Index> Sum() {
    PTC_ASSIGN_OR_RETURN(Index v, Product());
    while (true) {
      if (Eat('+')) {
        PTC_ASSIGN_OR_RETURN(Index r, Product());
        if (__builtin_add_overflow(v, r, &v)) return Error("overflow");
      } else if (Eat('-')) {
        PTC_ASSIGN_OR_RETURN(Index r, Product());
        if (__builtin_sub_overflow(v, r, &v)) return Error("overflow");
      } else {
        return v;
      }
    }
  }
  Result<Index> Product() {
    PTC_ASSIGN_OR_RETURN(Index v, Atom());
    while (true) {
      if (Eat('*')) {
        PTC_ASSIGN_OR_RETURN(Index r, Atom());
        if (__builtin_mul_overflow(v, r, &v)) return Error("overflow");
      } else if (Eat('/')) {
        PTC_ASSIGN_OR_RETURN(Index r, Atom());
        if (r == 0 || v % r != 0) return Error(std::to_string(v) + " is not divisible by " + std::to_string(r));
        v /= r;
      } else {
        return v;
      }
    }
  }
  Result<Index> Atom() {
    if (++depth_ > 64) return Error("nested too deeply");
    Skip();
    if (pos_ >= text_.size()) return Error("unexpected end");
    char c = text_[pos_];
    if (c == '!') {  // 1 where the atom is 0, else 0 ("when": "!kv_lora")
      ++pos_;
      PTC_ASSIGN_OR_RETURN(Index v, Atom());
      --depth_;
      return Index{v == 0};
    }
    if (c == '(') {
      ++pos_;
      PTC_ASSIGN_OR_RETURN(Index v, Sum());
      if (!Eat(')')) return Error("missing ')'");
      --depth_;
      return v;
    }
    size_t start = pos_;
    if (std::isdigit(static_cast<unsigned char>(c))) {
      Index v = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, text_[pos_] - '0', &v)) {
          return Error("number too large");
        }
        ++pos_;
      }
      --depth_;
      return v;
    }
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
    if (start == pos_) return Error("unexpected '" + std::string(1, c) + "'");
    std::string_view name = text_.substr(start, pos_ - start);
    std::optional<Index> v = lookup_(name);
    if (!v) return Error("unknown name '" + std::string(name) + "'");
    --depth_;
    return *v;
  }

  std::string_view text_;
  const VariableLookup& lookup_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<Index> EvalExpr(std::string_view formula, const VariableLookup& lookup) {
  return Parser(formula, lookup).Parse();
}

}  // namespace ptc
