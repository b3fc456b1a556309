#include "entries.hpp"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <span>

#include "ckpt/manifest.hpp"
#include "config/config.hpp"
#include "config/settings.hpp"
#include "config/validate.hpp"
#include "data/tokenizer_bpe.hpp"
#include "data/tokenizer_json.hpp"
#include "idx_file.hpp"
#include "plugin/registry.hpp"
#include "token_file.hpp"
#include "util/safetensors.hpp"

namespace fs = std::filesystem;

namespace tessera::fuzz {

namespace {

// A private scratch directory for readers that take a path; removed at exit.
const fs::path &scratch() {
  static const fs::path dir = [] {
    std::error_code ec;
    fs::path base = fs::exists("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string tmpl = (base / "tessera_fuzz_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) std::abort();
    static const std::string keep = tmpl;
    std::atexit([] {
      std::error_code e;
      fs::remove_all(keep, e);
    });
    return fs::path(tmpl);
  }();
  return dir;
}

fs::path write_input(const std::string &name, const uint8_t *data, size_t size) {
  fs::path p = scratch() / name;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(data), static_cast<std::streamsize>(size));
  out.close();
  return p;
}

// Runs `f`; an exception is the reader refusing the input, which is fine.
template <class F>
int guarded(F &&f) {
  try {
    f();
  } catch (const std::exception &) {
  }
  return 0;
}

// The plugins' declared parameters, loaded once: the libraries next to the
// binary (the build tree) and TESSERA_PLUGIN_PATH.
const Registry &plugins() {
  static const Registry *reg = [] {
    auto *r = new Registry();
    r->scan(Registry::search_dirs({}));
    return r;
  }();
  return *reg;
}

// What load_job checks, without loading anything new per input: the engine
// sections, then each plugin slot's section against its plugin's schema.
void validate(const config::Document &doc) {
  toml::table engine;
  config::resolve_settings(doc, 1, &engine);
  const Registry &reg = plugins();
  for (const auto &slot : config::plugin_slots()) {
    const toml::node *node = config::find(doc.root(), slot.section);
    std::string name = slot.default_plugin;
    if (node && node->is_table())
      if (const toml::node *p = node->as_table()->get("plugin"); p && p->is_string())
        name = p->as_string()->get();
    if (name.empty()) continue;
    const PluginEntry *e = reg.find(kind_short_name(slot.kind), name);
    if (!e) continue;
    config::validate_section(doc, slot.section, std::span<const tsr_param_decl>(e->params),
                             {"plugin"});
  }
  (void)config::to_toml(doc.root());
}

}  // namespace

int toml_config(const uint8_t *data, size_t size) {
  return guarded([&] {
    config::Document doc = config::Document::from_string(
        std::string(reinterpret_cast<const char *>(data), size), "fuzz.toml");
    validate(doc);
  });
}

int deepspeed_json(const uint8_t *data, size_t size) {
  return guarded([&] {
    const fs::path p = write_input("ds.json", data, size);
    config::Document doc;
    doc.apply_deepspeed(p.string());
    (void)config::to_toml(doc.root());
    validate(doc);
  });
}

int safetensors(const uint8_t *data, size_t size) {
  return guarded([&] {
    const fs::path p = write_input("input.safetensors", data, size);
    SafetensorsFile f(p.string());
    // Touch every byte each tensor claims: out of bounds shows under ASan.
    unsigned sum = 0;
    for (const auto &[name, t] : f.tensors()) {
      const auto *b = static_cast<const unsigned char *>(t.data);
      for (size_t i = 0; i < t.bytes; ++i) sum += b[i];
    }
    if (sum == 0xFFFFFFFFu) std::fputc(' ', stderr);  // keep the loop
  });
}

int ckpt_manifest(const uint8_t *data, size_t size) {
  return guarded([&] {
    nlohmann::json m = parse_manifest(std::string(reinterpret_cast<const char *>(data), size),
                                      "fuzz/manifest.json");
    // What the loaders then do with the numbers: sizes of the parameter
    // table, each piece's byte range and checksum blocks.
    size_t total = 0;
    for (const auto &p : m.at("params")) {
      size_t n = 1;
      for (const auto &d : p.at("shape")) n *= d.get<size_t>();
      total += n;
    }
    for (const auto &f : m.at("files"))
      for (const auto &t : f.at("tensors")) {
        const size_t end = t.at("offset").get<size_t>() + t.at("count").get<size_t>() * 4;
        if (end > f.at("bytes").get<size_t>() || t.at("start").get<size_t>() > total) std::abort();
      }
  });
}

int ckpt_coverage(const uint8_t *data, size_t size) {
  return guarded([&] {
    // Past the checksum (a fuzzer cannot forge SHA-256): what the check
    // itself lets through must keep its promises, or the input crashes.
    const nlohmann::json m =
        nlohmann::json::parse(std::string(reinterpret_cast<const char *>(data), size));
    check_manifest(m, "fuzz/manifest.json");
    const auto u = [&](const char *k) { return m.at(k).get<uint64_t>(); };
    if (u("global_batch") == 0 || u("epoch") > u("step") || u("batch_in_epoch") > u("step") ||
        u("samples") < u("step") || u("batch_in_epoch") > (uint64_t{1} << 40) ||
        u("global_batch") > (uint64_t{1} << 22))
      std::abort();
    uint64_t total = 0;
    for (const auto &p : m.at("params")) {
      uint64_t n = 1;
      for (const auto &d : p.at("shape")) n *= d.get<uint64_t>();
      total += n;
    }
    // Each slot's tensors tile [0, total); each file's run end to end.
    std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> slots;
    for (const auto &f : m.at("files")) {
      std::vector<std::pair<uint64_t, uint64_t>> bytes;
      for (const auto &t : f.at("tensors")) {
        slots[t.at("slot").get<std::string>()].push_back(
            {t.at("start").get<uint64_t>(), t.at("count").get<uint64_t>()});
        bytes.push_back({t.at("offset").get<uint64_t>(), t.at("count").get<uint64_t>() * 4});
      }
      std::sort(bytes.begin(), bytes.end());
      for (size_t k = 1; k < bytes.size(); ++k)
        if (bytes[k].first != bytes[k - 1].first + bytes[k - 1].second) std::abort();
      if (!bytes.empty() &&
          bytes.back().first + bytes.back().second != f.at("bytes").get<uint64_t>())
        std::abort();
    }
    for (const auto &s : m.at("slots")) {
      auto &runs = slots[s.get<std::string>()];
      std::sort(runs.begin(), runs.end());
      uint64_t at = 0;
      for (const auto &[start, count] : runs) {
        if (start != at) std::abort();
        at += count;
      }
      if (at != total) std::abort();
    }
    if (slots.size() != m.at("slots").size()) std::abort();
  });
}

int idx(const uint8_t *data, size_t size) {
  return guarded([&] {
    const fs::path p = write_input("input-idx", data, size);
    for (uint32_t ndim : {1u, 3u}) {
      try {
        idx::IdxArray a = idx::read_idx_u8(p.string(), "fuzz", ndim);
        size_t total = 1;
        for (uint32_t d : a.dims) total *= d;
        if (total != a.data.size()) std::abort();
      } catch (const std::exception &) {
      }
    }
  });
}

int token_shard(const uint8_t *data, size_t size) {
  return guarded([&] {
    const fs::path p = write_input("input.bin", data, size);
    tokens::Shard s(p.string());
    uint64_t sum = 0;
    for (int64_t i = 0; i < s.count(); ++i) sum += s.at(i);
    if (s.count() > 0) {
      std::vector<int32_t> out(static_cast<size_t>(s.count()));
      s.copy(0, s.count(), out.data());
    }
    if (sum == ~uint64_t{0}) std::fputc(' ', stderr);
  });
}

int tokenizer(const uint8_t *data, size_t size) {
  return guarded([&] {
    const std::string all(reinterpret_cast<const char *>(data), size);
    const std::string sep = "\n#----vocab.bpe----\n";
    const size_t at = all.find(sep);
    const std::string enc = at == std::string::npos ? all : all.substr(0, at);
    const std::string bpe = at == std::string::npos ? "" : all.substr(at + sep.size());
    data::Gpt2Bpe t(enc, "fuzz/encoder.json", bpe, "fuzz/vocab.bpe");
    // Encode a fixed text and a slice of the input, and decode them back.
    std::vector<uint32_t> ids = t.encode("Hello world's 12 tokens,  new\nlines\xff\xc3\xa9!");
    t.encode(std::string_view(all).substr(0, 128), ids);
    (void)t.decode(ids);
  });
}

int tokenizer_json(const uint8_t *data, size_t size) {
  return guarded([&] {
    const std::string all(reinterpret_cast<const char *>(data), size);
    data::TokenizerJson t(all, "fuzz/tokenizer.json");
    // Encode a fixed text (special tokens, NFC candidates, invalid UTF-8)
    // and a slice of the input, and decode them back.
    std::vector<uint32_t> ids =
        t.encode("Hello world's 12 tokens,  new\nlines\xff\xc3\xa9 cafe\xcc\x81<|endoftext|>!");
    t.encode(std::string_view(all).substr(0, 128), ids);
    (void)t.decode(ids);
  });
}

const std::vector<Target> &targets() {
  static const std::vector<Target> all = {
      {"toml_config", toml_config},       {"deepspeed_json", deepspeed_json},
      {"safetensors", safetensors},       {"ckpt_manifest", ckpt_manifest},
      {"ckpt_coverage", ckpt_coverage},   {"idx", idx},
      {"token_shard", token_shard},       {"tokenizer", tokenizer},
      {"tokenizer_json", tokenizer_json},
  };
  return all;
}

Entry find(const std::string &name) {
  for (const auto &t : targets())
    if (name == t.name) return t.entry;
  return nullptr;
}

}  // namespace tessera::fuzz
