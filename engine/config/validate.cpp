// Validation of config sections against declared parameters.
#include "config/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string_view>
#include <utility>

namespace tessera::config {

const char *type_name(tsr_param_type t) {
  switch (t) {
    case TSR_PARAM_BOOL:
      return "a boolean";
    case TSR_PARAM_INT:
      return "an integer";
    case TSR_PARAM_FLOAT:
      return "a number";
    case TSR_PARAM_STRING:
      return "a string";
    case TSR_PARAM_INT_ARRAY:
      return "an array of integers";
    case TSR_PARAM_FLOAT_ARRAY:
      return "an array of numbers";
    case TSR_PARAM_STRING_ARRAY:
      return "an array of strings";
    default:
      return "an unknown type";
  }
}

namespace {

std::vector<std::string> choice_list(const char *choices);

}  // namespace

bool takes_number(const tsr_param_decl &d) {
  if (d.type != TSR_PARAM_STRING) return false;
  for (const auto &c : choice_list(d.choices))
    if (c == "#") return true;
  return false;
}

std::string decl_type_name(const tsr_param_decl &d) {
  return takes_number(d) ? "a number or a word" : type_name(d.type);
}

namespace {

std::string render(const toml::node &n) {
  std::ostringstream os;
  n.visit([&](const auto &v) {
    if constexpr (toml::is_table<decltype(v)>)
      os << "a table";
    else if constexpr (toml::is_array<decltype(v)>)
      os << toml::toml_formatter(v);
    else if constexpr (toml::is_string<decltype(v)>)
      os << '"' << v.get() << '"';
    else
      os << v;
  });
  return os.str();
}

std::string fmt_num(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

std::vector<std::string> choice_list(const char *choices) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream is(choices ? choices : "");
  while (std::getline(is, item, '|')) out.push_back(item);
  return out;
}

// Checks a number against the declared range.
void check_range(const tsr_param_decl &d, double x, const toml::node &n,
                 const std::function<void(const std::string &)> &fail) {
  if (!std::isfinite(x)) fail("expected a finite number, got " + render(n));
  if (d.has_min && x < d.min) fail("must be >= " + fmt_num(d.min) + ", got " + render(n));
  if (d.has_max && x > d.max) fail("must be <= " + fmt_num(d.max) + ", got " + render(n));
}

// A number or a word (takes_number): a number (or its text, as written
// before numbers were taken) in range, or one of the words.
void check_number_or_word(const tsr_param_decl &d, const toml::node &n,
                          const std::function<void(const std::string &)> &fail) {
  std::vector<std::string> words;
  bool any_text = false;  // '*': any text, which the key's own reader checks
  for (const auto &c : choice_list(d.choices)) {
    if (c == "*")
      any_text = true;
    else if (c != "#")
      words.push_back(c);
  }
  std::string expected = "a number from " + fmt_num(d.min) + " to " + fmt_num(d.max);
  for (const auto &w : words) expected += " or \"" + w + "\"";
  if (any_text) expected += " or a string";
  if (n.is_integer()) return check_range(d, static_cast<double>(n.as_integer()->get()), n, fail);
  if (n.is_floating_point()) return check_range(d, n.as_floating_point()->get(), n, fail);
  if (!n.is_string()) fail("expected " + expected + ", got " + render(n));
  const std::string v = n.as_string()->get();
  if (any_text || std::find(words.begin(), words.end(), v) != words.end()) return;
  char *end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size()) {
    const std::string dym = did_you_mean(v, words);
    fail("\"" + v + "\" is not " + expected +
         (dym.empty() ? "" : "; did you mean \"" + dym + "\"?"));
  }
  check_range(d, x, n, fail);
}

// Checks a scalar of the declared element type and its range. Integers are
// accepted where numbers are expected and widened.
void check_scalar(const tsr_param_decl &d, tsr_param_type elem, const toml::node &n,
                  const std::string &at, const std::string &key) {
  auto fail = [&](const std::string &why) { throw ConfigError(at + ": " + key + ": " + why); };
  switch (elem) {
    case TSR_PARAM_BOOL:
      if (!n.is_boolean()) fail("expected a boolean (true or false), got " + render(n));
      return;
    case TSR_PARAM_STRING:
      if (takes_number(d)) return check_number_or_word(d, n, fail);
      if (!n.is_string())
        fail("expected a string, got " + render(n) +
             (n.is_number() ? " (write it in quotes: \"" + render(n) + "\")" : ""));
      if (d.choices) {
        std::string v = n.as_string()->get(), choices = d.choices;
        std::string item;
        std::istringstream is(choices);
        bool ok = false;
        while (std::getline(is, item, '|'))
          if (item == v) ok = true;
        if (!ok) {
          std::string msg = "\"" + v + "\" is not one of " + choices;
          std::vector<std::string> opts;
          std::istringstream is2(choices);
          while (std::getline(is2, item, '|')) opts.push_back(item);
          std::string dym = did_you_mean(v, opts);
          if (!dym.empty()) msg += "; did you mean \"" + dym + "\"?";
          fail(msg);
        }
      }
      return;
    case TSR_PARAM_INT:
    case TSR_PARAM_FLOAT: {
      double x;
      if (n.is_integer()) {
        x = static_cast<double>(n.as_integer()->get());
      } else if (n.is_floating_point() && elem == TSR_PARAM_FLOAT) {
        x = n.as_floating_point()->get();
      } else {
        fail(std::string("expected ") + (elem == TSR_PARAM_INT ? "an integer" : "a number") +
             ", got " + render(n));
        return;
      }
      check_range(d, x, n, fail);
      return;
    }
    default:
      fail("internal: bad element type");
  }
}

tsr_param_type element_type(tsr_param_type t) {
  switch (t) {
    case TSR_PARAM_INT_ARRAY:
      return TSR_PARAM_INT;
    case TSR_PARAM_FLOAT_ARRAY:
      return TSR_PARAM_FLOAT;
    case TSR_PARAM_STRING_ARRAY:
      return TSR_PARAM_STRING;
    default:
      return t;
  }
}

bool is_array_type(tsr_param_type t) {
  return t == TSR_PARAM_INT_ARRAY || t == TSR_PARAM_FLOAT_ARRAY || t == TSR_PARAM_STRING_ARRAY;
}

// Validates node `n` of declaration d; returns the normalised node (ints
// widened to floats where floats are declared).
void check_value(const tsr_param_decl &d, toml::table &out, const toml::node &n,
                 const std::string &at, const std::string &key) {
  tsr_param_type elem = element_type(d.type);
  if (is_array_type(d.type)) {
    // One string where strings are declared is an array of one ("files = 'a*.bin'").
    if (d.type == TSR_PARAM_STRING_ARRAY && n.is_string()) {
      toml::array arr;
      arr.push_back(n.as_string()->get());
      check_scalar(d, elem, arr.back(), at, key);
      out.insert_or_assign(d.name, std::move(arr));
      return;
    }
    if (!n.is_array())
      throw ConfigError(at + ": " + key + ": expected " + type_name(d.type) + ", got " + render(n));
    toml::array arr;
    for (const auto &e : *n.as_array()) {
      if (elem == TSR_PARAM_FLOAT && e.is_integer())
        arr.push_back(static_cast<double>(e.as_integer()->get()));
      else
        e.visit([&](const auto &v) { arr.push_back(v); });
      check_scalar(d, elem, arr.back(), at, key);
    }
    out.insert_or_assign(d.name, std::move(arr));
    return;
  }
  // A number where a number or a word is declared: the plugin reads its text.
  if (takes_number(d) && n.is_number()) {
    check_scalar(d, elem, n, at, key);
    out.insert_or_assign(d.name, render(n));
    return;
  }
  if (elem == TSR_PARAM_FLOAT && n.is_integer()) {
    toml::value<double> v(static_cast<double>(n.as_integer()->get()));
    check_scalar(d, elem, v, at, key);
    out.insert_or_assign(d.name, v);
    return;
  }
  n.visit([&](const auto &v) {
    auto copy = v;
    check_scalar(d, elem, copy, at, key);
    out.insert_or_assign(d.name, std::move(copy));
  });
}

// After `--set SECTION.plugin=other` the file's other keys of the section
// stay, and the new plugin may not know them: say how to remove one.
std::string unset_hint(const Document &doc, const std::string &section, const toml::table &user,
                       const std::string &dotted, const std::string &key_at) {
  const toml::node *plugin = user.get("plugin");
  if (!plugin || key_at.rfind("--set", 0) == 0) return "";
  const std::string plugin_at = doc.where(section + ".plugin", plugin);
  if (plugin_at.rfind("--set", 0) != 0) return "";
  return " (" + plugin_at + " keeps the file's other [" + section +
         "] keys; --set cannot remove one: add --unset " + dotted + ")";
}

// The section's keys with their values. A plugin's dotted keys
// (`lora.rank`) come written as a sub-table (`lora.rank = 4` or
// `[model.lora]` in TOML, `--set model.lora.rank=4`) or quoted
// (`"lora.rank" = 4`, as a run's config.toml writes them back): both give
// the key `lora.rank`. A table is opened only where a declared name begins
// with its key and a dot, so sub-sections validated elsewhere stay whole.
void section_entries(const toml::table &t, const std::string &prefix,
                     std::span<const tsr_param_decl> decls,
                     std::vector<std::pair<std::string, const toml::node *>> &out) {
  for (const auto &[k, v] : t) {
    const std::string key = prefix + std::string(k.str());
    bool declared = false, opens = false;
    for (const auto &d : decls) {
      declared |= key == d.name;
      opens |= std::string_view(d.name).starts_with(key + ".");
    }
    if (v.is_table() && !declared && opens)
      section_entries(*v.as_table(), key + ".", decls, out);
    else
      out.emplace_back(key, &v);
  }
}

}  // namespace

toml::table parse_default(const tsr_param_decl &d, const std::string &owner) {
  try {
    return toml::parse(std::string("v = ") + (d.default_value ? d.default_value : ""));
  } catch (const toml::parse_error &e) {
    throw ConfigError(owner + ": declared default of '" + d.name +
                      "' is not valid TOML: " + std::string(e.description()));
  }
}

toml::table validate_section(const Document &doc, const std::string &section,
                             std::span<const tsr_param_decl> decls,
                             const std::vector<std::string> &passthrough) {
  const toml::node *node = find(doc.root(), section);
  const toml::table *user = nullptr;
  if (node) {
    if (!node->is_table())
      throw ConfigError(doc.where(section, node) + ": '" + section + "' must be a section (table)");
    user = node->as_table();
  }
  toml::table out;
  if (user) {
    std::vector<std::pair<std::string, const toml::node *>> entries;
    section_entries(*user, "", decls, entries);
    for (const auto &[key, node] : entries) {
      const toml::node &v = *node;
      bool pass = false;
      for (const auto &p : passthrough) pass |= (p == key);
      if (pass) {
        // (A named copy: clang before 16 cannot capture a structured binding.)
        const std::string &name = key;
        v.visit([&](const auto &x) { out.insert_or_assign(name, x); });
        continue;
      }
      const tsr_param_decl *d = nullptr;
      for (const auto &c : decls)
        if (key == c.name) d = &c;
      std::string dotted = section + "." + key;
      std::string at = doc.where(dotted, &v);
      if (!d) {
        std::vector<std::string> names(passthrough.begin(), passthrough.end());
        for (const auto &c : decls) names.push_back(c.name);
        std::string msg = at + ": unknown key '" + key + "' in [" + section + "]";
        std::string dym = did_you_mean(key, names);
        if (!dym.empty())
          msg += "; did you mean '" + dym + "'?";
        else if (!names.empty()) {
          msg += "; known keys:";
          for (const auto &nm : names) msg += " " + nm;
        }
        msg += unset_hint(doc, section, *user, dotted, at);
        throw ConfigError(msg);
      }
      check_value(*d, out, v, at, dotted);
    }
  }
  for (const auto &d : decls) {
    if (out.contains(d.name)) continue;
    if (!d.default_value)
      throw ConfigError(doc.where(section, node) + ": [" + section + "] needs '" + d.name + "' (" +
                        type_name(d.type) + "): " + (d.doc ? d.doc : ""));
    toml::table def = parse_default(d, "[" + section + "]");
    check_value(d, out, *def.get("v"), "default of [" + section + "]", section + "." + d.name);
  }
  return out;
}

}  // namespace tessera::config
