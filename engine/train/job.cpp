#include "train/job.hpp"

#include <filesystem>
#include <set>

#include "config/deepspeed.hpp"
#include "config/validate.hpp"

namespace fs = std::filesystem;

namespace tessera {

config::Document load_document(const JobOptions &opts) {
  if (opts.config_path.empty()) throw config::ConfigError("no config file given");
  // `tessera run ds.json`: the JSON over the TOML beside it, if any.
  const std::string &path = opts.config_path;
  const bool json_alone =
      opts.config_text.empty() && path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  config::Document doc = json_alone ? config::deepspeed_base(path)
                         : opts.config_text.empty()
                             ? config::Document::load(path)
                             : config::Document::from_string(opts.config_text, path);
  std::string jsons;  // the DeepSpeed JSONs layered, for messages
  auto layer = [&](const std::string &json) {
    doc.apply_deepspeed(json);
    jsons += (jsons.empty() ? "" : " and ") + json;
  };
  // run.deepspeed names a JSON relative to the config file (or to the
  // working directory when --set gives it). The overrides are applied to a
  // copy first so that --set run.deepspeed=F counts too.
  config::Document probe = doc;
  for (const auto &u : opts.unsets)
    if (config::find(probe.root(), u)) probe.erase(u);
  for (const auto &s : opts.sets) probe.apply_set(s);
  if (const toml::node *ds = config::find(probe.root(), "run.deepspeed")) {
    std::string at = probe.where("run.deepspeed", ds);
    if (!ds->is_string()) throw config::ConfigError(at + ": run.deepspeed: expected a string path");
    std::string p = ds->as_string()->get();
    if (!p.empty()) {
      bool from_set = at.rfind("--set", 0) == 0;
      fs::path full = fs::path(p).is_absolute() || from_set
                          ? fs::path(p)
                          : fs::path(opts.config_path).parent_path() / p;
      layer(full.string());
    }
  }
  if (json_alone) layer(path);
  if (!opts.deepspeed_path.empty()) layer(opts.deepspeed_path);
  if (!jsons.empty()) config::note_toml_additions(doc, jsons);
  if (!opts.model.empty()) config::take_model(doc, opts.model);
  if (!opts.data.empty()) config::take_data(doc, opts.data);
  // Removals first, so that `--unset optimizer --set optimizer.plugin=adam`
  // starts the section afresh whatever the order on the command line.
  for (const auto &u : opts.unsets) doc.unset(u);
  for (const auto &s : opts.sets) doc.apply_set(s);
  config::check_string_sizes(doc);
  if (json_alone) config::require_model_and_data(doc, path);
  if (!jsons.empty()) config::default_duration(doc, jsons);
  return doc;
}

namespace {

// run.plugin_path, like run.deepspeed, is relative to the config file (to
// the working directory when --set gives it); made absolute, so that the
// run's config.toml finds the same plugins from anywhere.
void resolve_plugin_path(Job &job) {
  const toml::node *n = config::find(job.doc.root(), "run.plugin_path");
  if (!n) return;
  const bool from_set = job.doc.where("run.plugin_path", n).rfind("--set", 0) == 0;
  const fs::path base = from_set ? fs::path() : fs::path(job.doc.path()).parent_path();
  toml::array resolved;
  for (auto &p : job.settings.plugin_path) {
    if (!p.empty()) p = fs::absolute(base / p).lexically_normal().string();
    resolved.push_back(p);
  }
  if (auto *run = job.engine["run"].as_table()) run->insert_or_assign("plugin_path", resolved);
}

// Keys a DeepSpeed mapping set for a feature that `entry` does not have
// (Document::set_if_declared): dropped, with a warning that says so and
// names the plugins of the same kind that have it.
void drop_undeclared(Job &job, const std::string &section, const PluginEntry &entry) {
  std::vector<std::string> declared;
  for (const auto &d : entry.params) declared.emplace_back(d.name);
  for (const auto &u : job.doc.take_undeclared(section, declared)) {
    const std::string name = u.key.substr(section.size() + 1);
    std::set<std::string> have;
    for (const auto &e : job.registry->plugins())
      for (const auto &d : e.params)
        if (e.kind == entry.kind && name == d.name) have.insert(e.desc->name);
    std::string with;
    for (const auto &h : have) with += (with.empty() ? "" : ", ") + h;
    job.doc.warn(
        u.origin + ": the " + entry.kind + " plugin '" + entry.desc->name + "' has no '" + name +
        "' parameter (" + u.feature + "); ignored" +
        (with.empty() ? std::string() : " (" + entry.kind + " plugins with it: " + with + ")"));
  }
}

}  // namespace

const PluginChoice &Job::plugin(const std::string &section) const {
  auto it = plugins.find(section);
  if (it == plugins.end()) throw config::ConfigError("config has no [" + section + "] section");
  return it->second;
}

Job load_job(const JobOptions &opts, uint32_t world_size, bool training) {
  Job job;
  job.world_size = world_size;
  job.doc = load_document(opts);
  job.settings = config::resolve_settings(job.doc, world_size, &job.engine, training);

  resolve_plugin_path(job);
  std::vector<std::string> dirs = opts.plugin_paths;
  for (const auto &p : job.settings.plugin_path) dirs.push_back(p);
  job.registry = std::make_unique<Registry>();
  job.registry->scan(Registry::search_dirs(dirs));

  for (const auto &slot : config::plugin_slots()) {
    std::string section = slot.section;
    const toml::node *node = config::find(job.doc.root(), section);
    bool needed =
        training ? slot.required_for_train : (section == "model" || section == "data.train");
    std::string name = slot.default_plugin;
    const toml::node *plugin_node = node;
    if (node) {
      if (!node->is_table())
        throw config::ConfigError(job.doc.where(section, node) + ": '" + section +
                                  "' must be a section");
      if (const toml::node *p = node->as_table()->get("plugin")) {
        if (!p->is_string())
          throw config::ConfigError(job.doc.where(section + ".plugin", p) + ": " + section +
                                    ".plugin: expected a string (a plugin name)");
        name = p->as_string()->get();
        plugin_node = p;
      }
    }
    if (name.empty()) {
      if (!node && !needed) continue;
      std::string kind = kind_short_name(slot.kind);
      std::string known;
      for (const auto &e : job.registry->plugins())
        if (e.kind == kind) known += std::string(" ") + e.desc->name;
      throw config::ConfigError(job.doc.where(section, node) + ": [" + section +
                                "] needs 'plugin' (" +
                                (kind == "optimizer" || kind == "offload" ? "an " : "a ") + kind +
                                " plugin; known:" + (known.empty() ? " none" : known) + ")");
    }
    if (!node && !needed && slot.default_plugin[0] == '\0') continue;
    std::string kind = kind_short_name(slot.kind);
    const PluginEntry *entry = nullptr;
    try {
      entry = &job.registry->get(kind, name);
    } catch (const config::ConfigError &e) {
      throw config::ConfigError(job.doc.where(section + ".plugin", plugin_node) + ": [" + section +
                                "] " + e.what());
    }
    drop_undeclared(job, section, *entry);
    PluginChoice choice;
    choice.entry = entry;
    choice.values = config::validate_section(
        job.doc, section, std::span<const tsr_param_decl>(entry->params), {"plugin"});
    choice.values.erase("plugin");
    job.plugins[section] = std::move(choice);
  }
  return job;
}

std::string Job::resolved_toml() const {
  toml::table all = engine;
  for (const auto &[section, choice] : plugins) {
    toml::table t = choice.values;
    t.insert_or_assign("plugin", std::string(choice.entry->desc->name));
    if (section.rfind("data.", 0) == 0) {
      toml::table *data = all["data"].as_table();
      if (!data) {
        all.insert_or_assign("data", toml::table{});
        data = all["data"].as_table();
      }
      data->insert_or_assign(section.substr(5), std::move(t));
    } else {
      all.insert_or_assign(section, std::move(t));
    }
  }
  return config::to_toml(all);
}

}  // namespace tessera
