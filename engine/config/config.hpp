// The user's configuration: a TOML file (or a DeepSpeed JSON), DeepSpeed
// JSON layered on top, and --set overrides, merged into one TOML table that
// remembers where each value came from. Validation against declared
// parameters lives in validate.hpp.
#pragma once

#include <toml++/toml.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "util/error.hpp"

namespace tessera::config {

// A configuration error; the message already names the file, line and key.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string &message) : Error(TSR_ERR_CONFIG, message) {}
};

// The text of a config file (`what`: "config file", "DeepSpeed config"), a
// regular file of at most 64 MiB; a FIFO, a device or a directory is
// refused without reading it (reading could block forever).
std::string read_config_file(const std::string &path, const std::string &what);

// Bounds on what a config may hold (docs/security.md): a config file (TOML,
// DeepSpeed JSON, hostfile, env file) of at most 4 MiB, every string in it
// (after --set) of at most 64 KiB.
inline constexpr uint64_t kMaxConfigFileBytes = uint64_t{4} << 20;
inline constexpr size_t kMaxConfigString = size_t{64} << 10;

class Document {
 public:
  // Reads a TOML file, or a DeepSpeed JSON when the name ends in .json.
  static Document load(const std::string &path);
  static Document from_string(const std::string &toml_text, const std::string &name);

  // Layers a DeepSpeed JSON on top (see deepspeed.cpp for the mapping).
  void apply_deepspeed(const std::string &path);
  // Applies one "section.key=value" override; the value is parsed as TOML
  // (so 3e-4, true, [1, 2] and "text" keep their types), falling back to a
  // plain string.
  void apply_set(const std::string &assignment);
  // Sets a dotted key, creating tables on the way, and records its origin.
  void set(const std::string &dotted_key, toml::node &&value, const std::string &origin);
  void set_value(const std::string &dotted_key, const toml::node &value, const std::string &origin);
  // A key that a DeepSpeed mapping sets in a plugin's section for a feature
  // only some plugins have (activation_checkpointing -> model.recompute):
  // where the chosen plugin does not declare it, the key is dropped with a
  // warning naming `feature` (take_undeclared), not refused as a typo. A
  // later set() or erase() of the key makes it an ordinary key again.
  void set_if_declared(const std::string &dotted_key, toml::node &&value, const std::string &origin,
                       const std::string &feature);
  struct Undeclared {
    std::string key;      // "model.recompute"
    std::string origin;   // "ds.json: activation_checkpointing"
    std::string feature;  // "activation checkpointing"
  };
  // Removes from `section` the keys set_if_declared put there that
  // `declared` lacks, and returns them.
  std::vector<Undeclared> take_undeclared(const std::string &section,
                                          const std::vector<std::string> &declared);
  // Removes a whole table (a section replaced wholesale by DeepSpeed JSON).
  void erase(const std::string &dotted_key);
  // `--unset KEY`: removes a key or a whole section; throws ConfigError,
  // with the closest key, when the config has no such key.
  void unset(const std::string &dotted_key);

  // "file:line" for a key, or the override that set it.
  std::string where(const std::string &dotted_key, const toml::node *node) const;

  const std::string &path() const { return path_; }
  toml::table &root() { return root_; }
  const toml::table &root() const { return root_; }
  const std::vector<std::string> &warnings() const { return warnings_; }
  // Each warning once: the same JSON layered twice (run.deepspeed and
  // --deepspeed_config) says each thing once.
  void warn(const std::string &w) {
    if (std::find(warnings_.begin(), warnings_.end(), w) == warnings_.end()) warnings_.push_back(w);
  }
  // What the run will do that the user may not expect from what they wrote
  // (the settings a TOML adds under a DeepSpeed JSON): printed at start,
  // not warnings.
  const std::vector<std::string> &notes() const { return notes_; }
  void note(const std::string &n) { notes_.push_back(n); }

 private:
  toml::table root_;
  std::string path_;
  std::map<std::string, std::string> origins_;      // dotted key -> "--set" / "ds.json"
  std::map<std::string, std::string> if_declared_;  // dotted key -> feature
  std::vector<std::string> warnings_;
  std::vector<std::string> notes_;
};

// The node at a dotted path ("data.train.plugin"), or nullptr.
const toml::node *find(const toml::table &root, const std::string &dotted_key);

// Throws ConfigError naming the key and where it came from when a string
// of `doc` is longer than kMaxConfigString.
void check_string_sizes(const Document &doc);

// The closest candidate to `key` by edit distance, or "" when none is close.
std::string did_you_mean(const std::string &key, const std::vector<std::string> &candidates);

// Renders a table as TOML text, sections in order.
std::string to_toml(const toml::table &t);

}  // namespace tessera::config
