#include "launch/hostfile.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "config/config.hpp"
#include "util/text.hpp"

extern char **environ;

namespace tessera {

namespace {

using config::ConfigError;

std::string strip_comment(const std::string &line) {
  auto hash = line.find('#');
  return trim(hash == std::string::npos ? line : line.substr(0, hash));
}

constexpr long kMaxSlotsPerHost = 1024;
// A job's size as a hostfile may state it (docs/multi-node.md): far beyond
// any cluster a job spans (16384 hosts of 8 GPUs), and small enough that
// the plan of every rank stays a few MiB. A 100,000-host file planned
// 102,400,000 ranks (676 MB) before these bounds.
constexpr size_t kMaxHosts = 16384;
constexpr size_t kMaxRanks = 131072;

// A non-negative decimal integer, or -1.
long parse_count(const std::string &s) {
  if (s.empty() || s.size() > 9) return -1;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  return std::strtol(s.c_str(), nullptr, 10);
}

bool valid_env_name(const std::string &name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

// "host1:0,2@host2" -> {host1: {0, 2}, host2: {} (every slot)}, in order.
std::vector<std::pair<std::string, std::vector<int>>> parse_filter(const std::string &option,
                                                                   const std::string &text) {
  std::vector<std::pair<std::string, std::vector<int>>> out;
  for (const std::string &item : split(text, '@')) {
    auto colon = item.find(':');
    std::string host = item.substr(0, colon);
    if (host.empty())
      throw ConfigError(option + " '" + text +
                        "': an empty host name (expected host[:slot,...]@...)");
    std::vector<int> slots;
    if (colon != std::string::npos) {
      for (const std::string &s : split(item.substr(colon + 1), ',')) {
        long n = parse_count(s);
        if (n < 0)
          throw ConfigError(option + " '" + text + "': slot '" + s + "' of host '" + host +
                            "' is not a slot number");
        slots.push_back(static_cast<int>(n));
      }
    }
    out.emplace_back(host, slots);
  }
  return out;
}

}  // namespace

std::vector<HostSlots> parse_hostfile(const std::string &path) {
  std::istringstream in(config::read_config_file(path, "hostfile"));
  std::vector<HostSlots> hosts;
  std::map<std::string, int> seen;  // host -> its line
  size_t ranks = 0;
  std::string raw;
  for (int line = 1; std::getline(in, raw); ++line) {
    const std::string text = strip_comment(raw);
    if (text.empty()) continue;
    const std::string where = path + ":" + std::to_string(line) + ": ";
    std::istringstream words(text);
    std::string host, slots, extra;
    words >> host >> slots >> extra;
    if (slots.empty() || !extra.empty() || slots.rfind("slots=", 0) != 0)
      throw ConfigError(where + "expected 'HOST slots=N', got '" + text + "'");
    if (host[0] == '-') throw ConfigError(where + "host '" + host + "' may not start with '-'");
    const long n = parse_count(slots.substr(6));
    if (n < 1)
      throw ConfigError(where + "'" + slots + "': the slot count must be a positive integer");
    // Each slot is a worker process with its pipes: a number beyond any
    // machine is a typo, refused before anything is sized by it.
    if (n > kMaxSlotsPerHost)
      throw ConfigError(where + "'" + slots + "': at most " + std::to_string(kMaxSlotsPerHost) +
                        " slots per host (one worker each)");
    if (const auto it = seen.find(host); it != seen.end())
      throw ConfigError(where + "host '" + host + "' is listed twice (first at line " +
                        std::to_string(it->second) + ")");
    seen[host] = line;
    if (hosts.size() == kMaxHosts)
      throw ConfigError(where + "more than " + std::to_string(kMaxHosts) +
                        " hosts: a hostfile lists at most " + std::to_string(kMaxHosts) +
                        " hosts and " + std::to_string(kMaxRanks) + " slots in all");
    ranks += static_cast<size_t>(n);
    if (ranks > kMaxRanks)
      throw ConfigError(where + "the hosts so far hold " + std::to_string(ranks) +
                        " slots: a hostfile lists at most " + std::to_string(kMaxRanks) +
                        " slots (ranks) in all");
    HostSlots h;
    h.host = host;
    h.line = line;
    for (int i = 0; i < n; ++i) h.slots.push_back(i);
    hosts.push_back(std::move(h));
  }
  if (hosts.empty()) throw ConfigError(path + ": the hostfile lists no hosts");
  return hosts;
}

std::vector<HostSlots> select_hosts(std::vector<HostSlots> hosts, const std::string &include,
                                    const std::string &exclude, int num_nodes, int num_gpus) {
  if (!include.empty() && !exclude.empty())
    throw ConfigError("--include and --exclude cannot be used together");
  if ((!include.empty() || !exclude.empty()) && (num_nodes >= 0 || num_gpus >= 0))
    throw ConfigError("--num_nodes and --num_gpus cannot be used with --include or --exclude");
  auto find = [&](const std::string &option, const std::string &name) -> HostSlots & {
    for (auto &h : hosts)
      if (h.host == name) return h;
    throw ConfigError(option + ": host '" + name + "' is not in the hostfile");
  };
  auto check_slot = [](const std::string &option, const HostSlots &h, int s) {
    if (std::find(h.slots.begin(), h.slots.end(), s) == h.slots.end())
      throw ConfigError(option + ": host '" + h.host + "' has no slot " + std::to_string(s) +
                        " (it has " + std::to_string(h.slots.size()) + ")");
  };
  if (!include.empty()) {
    std::map<std::string, std::vector<int>> keep;
    for (const auto &[name, slots] : parse_filter("--include", include)) {
      HostSlots &h = find("--include", name);
      for (int s : slots) check_slot("--include", h, s);
      auto &k = keep[name];
      k.insert(k.end(), slots.empty() ? h.slots.begin() : slots.begin(),
               slots.empty() ? h.slots.end() : slots.end());
    }
    std::vector<HostSlots> out;
    for (auto &h : hosts) {
      auto it = keep.find(h.host);
      if (it == keep.end()) continue;
      std::set<int> uniq(it->second.begin(), it->second.end());
      h.slots.assign(uniq.begin(), uniq.end());
      out.push_back(h);
    }
    hosts = std::move(out);
  } else if (!exclude.empty()) {
    for (const auto &[name, slots] : parse_filter("--exclude", exclude)) {
      HostSlots &h = find("--exclude", name);
      for (int s : slots) check_slot("--exclude", h, s);
      if (slots.empty())
        h.slots.clear();
      else
        for (int s : slots)
          h.slots.erase(std::remove(h.slots.begin(), h.slots.end(), s), h.slots.end());
    }
    hosts.erase(std::remove_if(hosts.begin(), hosts.end(),
                               [](const HostSlots &h) { return h.slots.empty(); }),
                hosts.end());
  } else {
    if (num_nodes == 0 || num_gpus == 0)
      throw ConfigError("--num_nodes and --num_gpus must be at least 1");
    if (num_nodes > 0) {
      if (num_nodes > static_cast<int>(hosts.size()))
        throw ConfigError("--num_nodes " + std::to_string(num_nodes) +
                          ": the hostfile lists only " + std::to_string(hosts.size()) + " hosts");
      hosts.resize(static_cast<size_t>(num_nodes));
    }
    if (num_gpus > 0)
      for (auto &h : hosts) {
        if (num_gpus > static_cast<int>(h.slots.size()))
          throw ConfigError("--num_gpus " + std::to_string(num_gpus) + ": host '" + h.host +
                            "' has only " + std::to_string(h.slots.size()) + " slots");
        h.slots.resize(static_cast<size_t>(num_gpus));
      }
  }
  if (hosts.empty()) throw ConfigError("the host selection leaves no hosts");
  return hosts;
}

std::vector<std::pair<std::string, std::string>> read_env_file(const std::string &path) {
  std::istringstream in(config::read_config_file(path, "environment file"));
  std::vector<std::pair<std::string, std::string>> out;
  std::string raw;
  for (int line = 1; std::getline(in, raw); ++line) {
    std::string text = trim(raw);
    if (text.empty() || text[0] == '#') continue;
    if (text.rfind("export ", 0) == 0) text = trim(text.substr(7));
    auto eq = text.find('=');
    const std::string where = path + ":" + std::to_string(line) + ": ";
    if (eq == std::string::npos)
      throw ConfigError(where + "expected KEY=VALUE, got '" + text + "'");
    std::string key = trim(text.substr(0, eq)), value = trim(text.substr(eq + 1));
    if (!valid_env_name(key)) throw ConfigError(where + "'" + key + "' is not a variable name");
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
        value.back() == value.front())
      value = value.substr(1, value.size() - 2);
    out.emplace_back(key, value);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> forwarded_env(
    const std::vector<std::string> &env_opts, std::vector<std::string> *notes) {
  std::vector<std::pair<std::string, std::string>> out;
  auto put = [&](const std::string &k, const std::string &v) {
    for (auto &kv : out)
      if (kv.first == k) {
        kv.second = v;
        return;
      }
    out.emplace_back(k, v);
  };
  // Home first, then the working directory, which wins.
  std::vector<std::string> files;
  if (const char *home = std::getenv("HOME")) files.push_back(std::string(home) + "/.tessera_env");
  files.push_back(".tessera_env");
  std::set<std::string> seen;
  for (const auto &f : files) {
    std::error_code ec;
    if (!std::filesystem::exists(f, ec)) continue;
    char real[4096];
    std::string key = ::realpath(f.c_str(), real) ? real : f;
    if (!seen.insert(key).second) continue;  // home is the working directory
    auto kv = read_env_file(f);
    for (const auto &[k, v] : kv) put(k, v);
    if (notes) notes->push_back("read " + std::to_string(kv.size()) + " variables from " + key);
  }
  // The launcher's own variables describe this process, not the nodes.
  static const std::set<std::string> own = {"TESSERA_LAUNCHED", "TESSERA_NODE_RANK",
                                            "TESSERA_ATTEMPT", "TESSERA_SSH_OPTS"};
  std::vector<std::pair<std::string, std::string>> prefixed;
  for (char **e = environ; e && *e; ++e) {
    std::string entry = *e;
    auto eq = entry.find('=');
    if (eq == std::string::npos) continue;
    std::string k = entry.substr(0, eq);
    if ((k.rfind("NCCL_", 0) == 0 || k.rfind("GLOO_", 0) == 0 || k.rfind("TESSERA_", 0) == 0) &&
        !own.count(k))
      prefixed.emplace_back(k, entry.substr(eq + 1));
  }
  std::sort(prefixed.begin(), prefixed.end());
  for (const auto &[k, v] : prefixed) put(k, v);
  for (const auto &opt : env_opts) {
    auto eq = opt.find('=');
    std::string k = opt.substr(0, eq);
    if (!valid_env_name(k))
      throw ConfigError("--env '" + opt + "': '" + k + "' is not a variable name");
    if (eq != std::string::npos) {
      put(k, opt.substr(eq + 1));
    } else if (const char *v = std::getenv(k.c_str())) {
      put(k, v);
    } else {
      throw ConfigError("--env " + k + ": the variable is not set here (use --env " + k +
                        "=VALUE to give it a value)");
    }
  }
  return out;
}

std::string shell_quote(const std::string &text) {
  bool plain = !text.empty();
  for (char c : text)
    if (!(std::isalnum(static_cast<unsigned char>(c)) ||
          std::string("@%+=:,./_-").find(c) != std::string::npos))
      plain = false;
  if (plain) return text;
  std::string out = "'";
  for (char c : text) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::vector<std::string> split_words(const std::string &text) {
  std::vector<std::string> out;
  std::string cur;
  bool have = false;
  char quote = 0;
  for (char c : text) {
    if (quote) {
      if (c == quote)
        quote = 0;
      else
        cur += c;
    } else if (c == '\'' || c == '"') {
      quote = c;
      have = true;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      if (have) out.push_back(cur);
      cur.clear();
      have = false;
    } else {
      cur += c;
      have = true;
    }
  }
  if (quote) throw ConfigError("unbalanced quote in ssh options '" + text + "'");
  if (have) out.push_back(cur);
  return out;
}

}  // namespace tessera
