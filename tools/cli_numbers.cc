#include "tools/cli_numbers.h"

#include <charconv>
#include <limits>
#include <string>

#include "ptc/base/status.h"

namespace ptcfs {
namespace {

template <typename T>
std::string IntegerProblem(const std::string& text) {
  const char* end = text.data() + text.size();
  const char* begin = text.data() + (!text.empty() && text[0] == '+' ? 1 : 0);
  T value{};
  const auto [at, ec] = std::from_chars(begin, end, value);
  const std::string shown = ptc::Abbreviate(text, 40);
  if (ec == std::errc::result_out_of_range) {
    if constexpr (std::is_unsigned_v<T>) {
      if (text[0] != '-') return shown + " is out of range (at most " + std::to_string(std::numeric_limits<T>::max()) + ")";
    } else {
      return shown + " is out of range (" + std::to_string(INT64_MIN) + " to " + std::to_string(INT64_MAX) + ")";
    }
  }
  if constexpr (std::is_unsigned_v<T>) {
    if (!text.empty() && text[0] == '-') return shown + " is negative (0 or more)";
  }
  if (ec != std::errc() || at != end) return shown + " is not an integer";
  return "";
}

}  // namespace

void CheckIntegerOptions(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type.starts_with("UINT")) {
      option->check(CLI::Validator([](std::string& s) { return IntegerProblem<uint64_t>(s); }, ""));
    } else if (type.starts_with("INT")) {
      option->check(CLI::Validator([](std::string& s) { return IntegerProblem<int64_t>(s); }, ""));
    }
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) CheckIntegerOptions(*sub);
}

CLI::Validator AtLeast(int64_t min) {
  return CLI::Validator(
      [min](std::string& s) -> std::string {
        int64_t value = 0;
        const auto [at, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
        if (ec == std::errc() && at == s.data() + s.size() && value < min)
          return ptc::Abbreviate(s, 40) + " is below " + std::to_string(min);
        return "";
      },
      ">= " + std::to_string(min));
}

}  // namespace ptcfs
