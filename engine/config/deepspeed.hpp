// DeepSpeed JSON configs: DeepSpeed's names and defaults mapped onto the
// engine's sections (see docs/config.md, "DeepSpeed JSON").
#pragma once

#include <string>
#include <vector>

namespace tessera::config {

class Document;

// Layers the DeepSpeed JSON at `path` onto `doc`. Sections the JSON speaks
// for (batch, optimizer, schedule) replace the TOML's wholesale; keys the
// engine does not use are reported as warnings.
void deepspeed_apply(Document &doc, const std::string &path);

// What tessera makes of the keys of one section of DeepSpeed's config
// (deepspeed_keys.cpp): a key in none of the three lists is a typo, refused
// with the closest key of the section.
struct DeepSpeedSection {
  std::vector<std::string> used;     // mapped onto tessera's config
  std::vector<std::string> knobs;    // DeepSpeed tuning knobs with no meaning here: warned
  std::vector<std::string> lacking;  // features tessera does not have: refused unless off
  std::vector<std::string> all() const;
  static bool has(const std::vector<std::string> &list, const std::string &key);
};

// The section at a dotted path ("" for the top level, "zero_optimization",
// "optimizer.params:sgd", "scheduler.params:WarmupLR"), or null for one
// tessera does not look into.
const DeepSpeedSection *deepspeed_section(const std::string &name);

// A DeepSpeed JSON run alone (`tessera run ds.json`, deepspeed_alone.cpp):
// the TOML beside it (ds.toml for ds.json) as the base, or an empty
// document named after the JSON when there is none.
Document deepspeed_base(const std::string &json_path);
// --model SOURCE / --data SOURCE: a TOML file whose [model] (resp. [data])
// replaces the config's, or a plugin's name for [model] (resp. [data.train]).
void take_model(Document &doc, const std::string &source);
void take_data(Document &doc, const std::string &source);
// Notes the settings the TOML under the DeepSpeed JSON(s) `json_names`
// adds beyond model and data (what the user may not know it brings).
void note_toml_additions(Document &doc, const std::string &json_names);
// A JSON run alone needs [model] and [data.train] from somewhere: the error
// names the flags and the TOML beside it.
void require_model_and_data(const Document &doc, const std::string &json_path);
// A DeepSpeed JSON says nothing of how long to train: one epoch, noted,
// when neither run.steps nor run.epochs is set.
void default_duration(Document &doc, const std::string &json_names);

}  // namespace tessera::config
