// A DeepSpeed JSON as the whole config: `tessera run ds.json` with the model
// and data from --model/--data or a TOML beside it, and what a TOML under a
// JSON brings besides (docs/config.md, "A DeepSpeed JSON alone").
#include <cctype>
#include <filesystem>
#include <sstream>

#include "config/config.hpp"
#include "config/deepspeed.hpp"

namespace tessera::config {

namespace fs = std::filesystem;

namespace {

bool is_toml_file(const std::string &s) {
  return s.size() > 5 && s.compare(s.size() - 5, 5, ".toml") == 0;
}

std::string beside(const std::string &json_path) {
  return fs::path(json_path).replace_extension(".toml").string();
}

// `section` of the TOML file `source` replaces the document's.
void take_section(Document &doc, const std::string &section, const std::string &source,
                  const std::string &flag) {
  Document from = Document::load(source);
  const toml::node *t = find(from.root(), section);
  if (!t || !t->is_table())
    throw ConfigError(flag + " " + source + ": the file has no [" + section + "] section");
  doc.erase(section);
  for (const auto &[k, v] : *t->as_table())
    doc.set_value(section + "." + std::string(k.str()), v, flag + " " + source);
}

std::string render_setting(const toml::node &n) {
  std::ostringstream os;
  n.visit([&](const auto &v) {
    if constexpr (toml::is_table<decltype(v)>)
      os << "{...}";
    else if constexpr (toml::is_array<decltype(v)>)
      os << toml::toml_formatter(v);
    else if constexpr (toml::is_string<decltype(v)>)
      os << '"' << v.get() << '"';
    else
      os << v;
  });
  return os.str();
}

// Keys a DeepSpeed user brings on purpose with a TOML under the JSON.
bool expected_from_toml(const std::string &key) {
  for (const char *s : {"model", "data.train", "data.eval", "run.deepspeed", "run.plugin_path"})
    if (key == s || key.rfind(std::string(s) + ".", 0) == 0) return true;
  return false;
}

void collect_file_keys(const Document &doc, const toml::table &t, const std::string &at,
                       std::vector<std::string> *out) {
  for (const auto &[k, v] : t) {
    const std::string key = at.empty() ? std::string(k.str()) : at + "." + std::string(k.str());
    if (expected_from_toml(key)) continue;
    if (v.is_table()) {
      collect_file_keys(doc, *v.as_table(), key, out);
      continue;
    }
    // A value from the file is named by its line there, not by an origin.
    const std::string at_file = doc.path() + ":", where = doc.where(key, &v);
    if (where.rfind(at_file, 0) == 0 && where.size() > at_file.size() &&
        std::isdigit(static_cast<unsigned char>(where[at_file.size()])))
      out->push_back(key + " = " + render_setting(v));
  }
}

}  // namespace

Document deepspeed_base(const std::string &json_path) {
  const std::string toml_path = beside(json_path);
  std::error_code ec;
  if (fs::is_regular_file(toml_path, ec)) return Document::load(toml_path);
  return Document::from_string("", json_path);
}

void take_model(Document &doc, const std::string &source) {
  if (is_toml_file(source)) return take_section(doc, "model", source, "--model");
  doc.erase("model");
  doc.set("model.plugin", toml::value<std::string>(source), "--model " + source);
}

void take_data(Document &doc, const std::string &source) {
  if (is_toml_file(source)) return take_section(doc, "data", source, "--data");
  doc.erase("data.train");
  doc.set("data.train.plugin", toml::value<std::string>(source), "--data " + source);
}

void note_toml_additions(Document &doc, const std::string &json_names) {
  std::vector<std::string> keys;
  collect_file_keys(doc, doc.root(), "", &keys);
  if (keys.empty()) return;
  std::string line = doc.path() + " adds to " + json_names + ":";
  for (size_t i = 0; i < keys.size(); ++i) line += (i ? ", " : " ") + keys[i];
  doc.note(line);
}

void require_model_and_data(const Document &doc, const std::string &json_path) {
  const bool model = find(doc.root(), "model.plugin") != nullptr;
  const bool data = find(doc.root(), "data.train.plugin") != nullptr;
  if (model && data) return;
  const std::string what = !model && !data ? "no model and no data"
                           : !model        ? "no model"
                                           : "no data";
  throw ConfigError(json_path + ": a DeepSpeed JSON names " + what +
                    " (DeepSpeed's script builds them): give them with --model (a model "
                    "plugin's name, or a TOML file with a [model] section) and --data (a TOML "
                    "file with [data.train], or a dataset plugin's name), or in " +
                    beside(json_path) +
                    " beside it ([model] and [data.train]; configs/deepspeed-tutorial.toml is "
                    "one)");
}

void default_duration(Document &doc, const std::string &json_names) {
  if (find(doc.root(), "run.steps") || find(doc.root(), "run.epochs")) return;
  const std::string why = json_names + " says nothing of how long to train";
  doc.set("run.epochs", toml::value<int64_t>(1), why);
  doc.note("run.epochs = 1: " + why +
           " (DeepSpeed's script loops itself); --set run.epochs=N or run.steps=N");
}

}  // namespace tessera::config
