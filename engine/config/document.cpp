// Loading and layering of configuration documents.
#include <algorithm>
#include <sstream>
#include <tessera/cpp/regular_file.hpp>

#include "config/config.hpp"
#include "config/deepspeed.hpp"

namespace tessera::config {

namespace {

std::vector<std::string> split_dots(const std::string &key) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : key) {
    if (c == '.') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  parts.push_back(cur);
  for (const auto &p : parts)
    if (p.empty()) throw ConfigError("invalid key '" + key + "': empty part between dots");
  return parts;
}

}  // namespace

std::string read_config_file(const std::string &path, const std::string &what) {
  std::string text, why;
  bool refused = false;
  // A config, a DeepSpeed JSON, a hostfile or an env file of more than
  // this is not one (the largest in configs/ is a few KiB).
  const uint64_t max = kMaxConfigFileBytes;
  if (!sdk::read_regular_file(path, &text, &why, max, &refused)) {
    if (!refused && why.rfind("is ", 0) == 0)  // larger than `max`
      throw ConfigError(path + ": the " + what + " " + why + " (a " + what + " holds at most " +
                        std::to_string(max >> 20) + " MiB)");
    throw ConfigError(refused ? path + ": the " + what + " " + why
                              : path + ": cannot open " + what + ": " + why);
  }
  return text;
}

namespace {

// Every string under `node` (tables, arrays) against kMaxConfigString.
void check_strings(const Document &doc, const toml::node &node, const std::string &key) {
  if (const auto *s = node.as_string()) {
    if (s->get().size() > kMaxConfigString)
      throw ConfigError(doc.where(key, &node) + ": " + key + " is a string of " +
                        std::to_string(s->get().size()) + " bytes; a config string holds at most " +
                        std::to_string(kMaxConfigString) +
                        " (a path, a name, a pattern): it would be copied into every run's "
                        "config.toml and summary.json");
  } else if (const auto *t = node.as_table()) {
    for (const auto &[k, v] : *t)
      check_strings(doc, v, key.empty() ? std::string(k.str()) : key + "." + std::string(k.str()));
  } else if (const auto *a = node.as_array()) {
    for (size_t i = 0; i < a->size(); ++i)
      check_strings(doc, *a->get(i), key + "[" + std::to_string(i) + "]");
  }
}

}  // namespace

void check_string_sizes(const Document &doc) {
  check_strings(doc, doc.root(), "");
}

Document Document::load(const std::string &path) {
  if (path.size() > 5 && path.substr(path.size() - 5) == ".json") {
    Document d;
    d.path_ = path;
    d.apply_deepspeed(path);
    return d;
  }
  return from_string(read_config_file(path, "config file"), path);
}

Document Document::from_string(const std::string &text, const std::string &name) {
  Document d;
  d.path_ = name;
  try {
    d.root_ = toml::parse(text, name);
  } catch (const toml::parse_error &e) {
    std::ostringstream msg;
    msg << name << ":" << e.source().begin.line << ":" << e.source().begin.column
        << ": TOML syntax error: " << e.description();
    throw ConfigError(msg.str());
  }
  return d;
}

void Document::apply_deepspeed(const std::string &path) {
  deepspeed_apply(*this, path);
}

void Document::set_value(const std::string &dotted_key, const toml::node &value,
                         const std::string &origin) {
  value.visit([&](const auto &v) {
    auto copy = v;
    set(dotted_key, std::move(copy), origin);
  });
}

void Document::set(const std::string &dotted_key, toml::node &&value, const std::string &origin) {
  auto parts = split_dots(dotted_key);
  toml::table *t = &root_;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node *n = t->get(parts[i]);
    if (!n) {
      t->insert(parts[i], toml::table{});
      n = t->get(parts[i]);
    }
    if (!n->is_table())
      throw ConfigError(origin + ": cannot set '" + dotted_key + "': '" + parts[i] +
                        "' is a value, not a section");
    t = n->as_table();
  }
  value.visit([&](auto &&v) { t->insert_or_assign(parts.back(), std::move(v)); });
  origins_[dotted_key] = origin;
  if_declared_.erase(dotted_key);
}

void Document::set_if_declared(const std::string &dotted_key, toml::node &&value,
                               const std::string &origin, const std::string &feature) {
  set(dotted_key, std::move(value), origin);
  if_declared_[dotted_key] = feature;
}

std::vector<Document::Undeclared> Document::take_undeclared(
    const std::string &section, const std::vector<std::string> &declared) {
  std::vector<Undeclared> taken;
  for (const auto &[key, feature] : if_declared_) {
    if (key.rfind(section + ".", 0) != 0) continue;
    const std::string name = key.substr(section.size() + 1);
    if (name.find('.') != std::string::npos) continue;  // a sub-section's key
    if (std::find(declared.begin(), declared.end(), name) == declared.end())
      taken.push_back({key, where(key, nullptr), feature});
  }
  for (const auto &u : taken) erase(u.key);
  return taken;
}

void Document::erase(const std::string &dotted_key) {
  auto parts = split_dots(dotted_key);
  toml::table *t = &root_;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node *n = t->get(parts[i]);
    if (!n || !n->is_table()) return;
    t = n->as_table();
  }
  t->erase(parts.back());
  for (auto *keys : {&origins_, &if_declared_})
    for (auto it = keys->begin(); it != keys->end();) {
      if (it->first == dotted_key || it->first.rfind(dotted_key + ".", 0) == 0)
        it = keys->erase(it);
      else
        ++it;
    }
}

void Document::unset(const std::string &dotted_key) {
  const std::string origin = "--unset " + dotted_key;
  if (dotted_key.empty()) throw ConfigError(origin + ": expected a key, e.g. optimizer.momentum");
  if (find(root_, dotted_key)) {
    erase(dotted_key);
    return;
  }
  // Nothing there: most likely a typo, so name the keys that are.
  const auto dot = dotted_key.rfind('.');
  const std::string parent = dot == std::string::npos ? "" : dotted_key.substr(0, dot);
  const toml::node *table = parent.empty() ? &root_ : find(root_, parent);
  std::vector<std::string> keys;
  if (table && table->is_table())
    for (const auto &[k, v] : *table->as_table())
      keys.push_back(parent.empty() ? std::string(k.str()) : parent + "." + std::string(k.str()));
  std::string msg = origin + ": the config has no '" + dotted_key + "' to remove";
  const std::string dym = did_you_mean(dotted_key, keys);
  if (!dym.empty()) msg += "; did you mean '" + dym + "'?";
  throw ConfigError(msg);
}

void Document::apply_set(const std::string &assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set '" + assignment + "': expected key=value, e.g. optimizer.lr=3e-4");
  std::string key = assignment.substr(0, eq);
  std::string text = assignment.substr(eq + 1);
  std::string origin = "--set " + assignment;
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error &) {
    set(key, toml::value<std::string>(text), origin);
    return;
  }
  set_value(key, *parsed.get("v"), origin);
}

std::string Document::where(const std::string &dotted_key, const toml::node *node) const {
  // An override names itself; a value from the file names file:line.
  for (std::string k = dotted_key;;) {
    auto it = origins_.find(k);
    if (it != origins_.end()) return it->second;
    auto dot = k.rfind('.');
    if (dot == std::string::npos) break;
    k = k.substr(0, dot);
  }
  if (node && node->source().begin.line > 0)
    return path_ + ":" + std::to_string(node->source().begin.line);
  // A section rebuilt by a DeepSpeed JSON or --set has no line in the file:
  // name where its keys came from.
  for (const auto &[k, origin] : origins_)
    if (k.rfind(dotted_key + ".", 0) == 0) return origin;
  return path_;
}

const toml::node *find(const toml::table &root, const std::string &dotted_key) {
  const toml::node *n = &root;
  size_t start = 0;
  while (start <= dotted_key.size()) {
    auto dot = dotted_key.find('.', start);
    std::string part =
        dotted_key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!n->is_table()) return nullptr;
    n = n->as_table()->get(part);
    if (!n) return nullptr;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return n;
}

std::string did_you_mean(const std::string &key, const std::vector<std::string> &candidates) {
  auto distance = [](const std::string &a, const std::string &b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  std::string best;
  size_t best_d = std::max<size_t>(2, key.size() / 3) + 1;
  for (const auto &c : candidates) {
    size_t d = distance(key, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

}  // namespace tessera::config
