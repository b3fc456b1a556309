// DeepSpeed's launcher options onto tessera's (deepspeed_forms.hpp).
#include "cli/deepspeed_forms.hpp"

#include <unistd.h>

#include <algorithm>
#include <optional>

#include "cli/args.hpp"

namespace tessera::cli {

namespace {

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at = s.find(sep); at != std::string::npos; at = s.find(sep, start)) {
    out.push_back(s.substr(start, at - start));
    start = at + 1;
  }
  out.push_back(s.substr(start));
  return out;
}

std::string join(const std::vector<std::string> &v, const char *sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

int count_of(const std::string &flag, const std::string &v, int min) {
  char *end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < min || x > 1 << 20)
    throw UsageError("tessera run: " + flag + " '" + v + "' is not a count of at least " +
                     std::to_string(min));
  return static_cast<int>(x);
}

bool is_this_host(const std::string &host) {
  if (host == "localhost" || host == "127.0.0.1") return true;
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 && host == name;
}

// The options this mapping reads, as given ("--num_gpus 2").
struct Given {
  std::optional<std::string> num_gpus, num_nodes, include, exclude, master_addr, master_port, n;
  bool hostfile = false, master = false;
  std::string text(const char *flag, const std::optional<std::string> &v) const {
    return v ? std::string(flag) + " " + *v : "";
  }
};

// `--include localhost:0,1` / `--exclude localhost:1` on one node: the
// host must be this one; slot numbers index `base` (the visible devices).
std::vector<std::string> slots_of(const std::string &flag, const std::string &spec,
                                  const std::vector<std::string> &base, bool base_known) {
  if (spec.find('@') != std::string::npos)
    throw UsageError("tessera run: " + flag + " " + spec +
                     " names several hosts: that needs --hostfile (docs/multi-node.md)");
  const auto colon = spec.find(':');
  const std::string host = spec.substr(0, colon);
  if (!is_this_host(host))
    throw UsageError("tessera run: " + flag + " " + spec + " names host '" + host +
                     "', not this one: another host needs --hostfile (docs/multi-node.md)");
  if (colon == std::string::npos) {
    if (!base_known)
      throw UsageError("tessera run: " + flag + " " + spec + ": name the devices (" + host +
                       ":0,1), or give --num_gpus N");
    return base;
  }
  std::vector<std::string> out;
  for (const auto &s : split(spec.substr(colon + 1), ',')) {
    char *end = nullptr;
    const long i = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || i < 0)
      throw UsageError("tessera run: " + flag + " " + spec + ": '" + s +
                       "' is not a device number");
    if (base_known && static_cast<size_t>(i) >= base.size())
      throw UsageError("tessera run: " + flag + " " + spec + ": device " + s +
                       " is not among the " + std::to_string(base.size()) + " visible (" +
                       join(base, ",") + ")");
    out.push_back(base_known ? base[static_cast<size_t>(i)] : s);
  }
  return out;
}

// -n and the visible devices from --num_gpus, --include and --exclude.
void map_devices(const Given &g, const char *cuda_visible, DeepSpeedForms *f) {
  if (!g.num_gpus && !g.include && !g.exclude) return;
  if (g.include && g.exclude)
    throw UsageError("tessera run: --include and --exclude cannot be used together");
  if (g.include && g.num_gpus)
    throw UsageError("tessera run: --include names the devices; drop --num_gpus");
  std::vector<std::string> base;
  const bool visible_set = cuda_visible && *cuda_visible;
  if (visible_set) base = split(cuda_visible, ',');
  const std::string visible_text = visible_set ? std::string(cuda_visible) : "";
  if (g.num_gpus) {
    const int n = count_of("--num_gpus", *g.num_gpus, 1);
    if (visible_set && static_cast<size_t>(n) > base.size())
      throw UsageError("tessera run: --num_gpus " + *g.num_gpus + ": CUDA_VISIBLE_DEVICES=" +
                       visible_text + " shows " + std::to_string(base.size()) + " device(s)");
    if (!visible_set)
      for (int i = 0; i < n; ++i) base.push_back(std::to_string(i));
    base.resize(static_cast<size_t>(n));
  }
  const bool base_known = visible_set || g.num_gpus;
  std::vector<std::string> devices = base;
  if (g.include) devices = slots_of("--include", *g.include, base, base_known);
  if (g.exclude) {
    if (!base_known)
      throw UsageError("tessera run: --exclude " + *g.exclude +
                       " on one node needs the devices to choose from: give --num_gpus N or set "
                       "CUDA_VISIBLE_DEVICES");
    const auto out = slots_of("--exclude", *g.exclude, base, true);
    devices.erase(std::remove_if(devices.begin(), devices.end(),
                                 [&](const std::string &d) {
                                   return std::find(out.begin(), out.end(), d) != out.end();
                                 }),
                  devices.end());
  }
  std::vector<std::string> parts;
  for (const auto &t : {g.text("--include", g.include), g.text("--exclude", g.exclude),
                        g.text("--num_gpus", g.num_gpus)})
    if (!t.empty()) parts.push_back(t);
  const std::string said = join(parts, " ");
  if (devices.empty()) throw UsageError("tessera run: " + said + " leaves no device");
  const std::string k = std::to_string(devices.size());
  if (g.n && *g.n != k)
    throw UsageError("tessera run: -n " + *g.n + " and " + said + " (" + k +
                     " workers) disagree; give one of them");
  f->args.insert(f->args.end(), {"-n", k});
  f->visible_devices = join(devices, ",");
  f->notes.push_back(said + ": -n " + k + ", CUDA_VISIBLE_DEVICES=" + f->visible_devices);
}

void map_master(const Given &g, DeepSpeedForms *f) {
  if (!g.master_addr && !(g.master_port && !g.hostfile)) return;
  if (g.master)
    throw UsageError(
        "tessera run: --master and --master_addr/--master_port say the same; give one");
  const std::string host = g.master_addr ? *g.master_addr : "127.0.0.1";
  const std::string port = g.master_port ? *g.master_port : "29500";
  f->args.insert(f->args.end(), {"--master", host + ":" + port});
  std::string said = g.text("--master_addr", g.master_addr);
  if (g.master_port) said += (said.empty() ? "" : " ") + g.text("--master_port", g.master_port);
  f->notes.push_back(said + ": --master " + host + ":" + port);
}

// The arguments with --deepspeed mapped and, for the launcher, the options
// map_deepspeed_forms reads taken into `g` (those a hostfile applies and the
// launcher's own kept in place).
Args scan(const Args &args, bool launcher, Given &g, DeepSpeedForms &f) {
  Args rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    std::string name = a, value;
    bool inline_value = false;
    if (const auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    if (name == "--deepspeed") {
      // Hugging Face's Trainer: --deepspeed FILE; DeepSpeed's scripts: a switch.
      const bool file =
          inline_value ||
          (i + 1 < args.size() && args[i + 1].rfind("-", 0) != 0 && args[i + 1].size() > 5 &&
           args[i + 1].compare(args[i + 1].size() - 5, 5, ".json") == 0);
      if (file) {
        rest.insert(rest.end(), {"--deepspeed_config", inline_value ? value : args[++i]});
      } else {
        f.notes.push_back(
            "--deepspeed: DeepSpeed's switch; tessera always uses the JSON it is "
            "given (--deepspeed_config)");
      }
      continue;
    }
    static const char *const kRead[] = {"--num_gpus",    "--num_nodes",   "--include", "--exclude",
                                        "--master_addr", "--master_port", "-n",        "--nproc",
                                        "--hostfile",    "--master"};
    const bool read =
        launcher && std::find(std::begin(kRead), std::end(kRead), name) != std::end(kRead);
    if (!read) {
      rest.push_back(a);
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) throw UsageError("tessera run: " + name + " needs a value");
      value = args[++i];
    }
    std::optional<std::string> *slot = name == "--num_gpus"                ? &g.num_gpus
                                       : name == "--num_nodes"             ? &g.num_nodes
                                       : name == "--include"               ? &g.include
                                       : name == "--exclude"               ? &g.exclude
                                       : name == "--master_addr"           ? &g.master_addr
                                       : name == "--master_port"           ? &g.master_port
                                       : name == "-n" || name == "--nproc" ? &g.n
                                                                           : nullptr;
    g.hostfile |= name == "--hostfile";
    g.master |= name == "--master";
    if (slot) *slot = value;
    // Kept as given: the launcher's own options, and the host selection
    // that the hostfile applies.
    const bool host_selection =
        name == "--num_gpus" || name == "--num_nodes" || name == "--include" || name == "--exclude";
    if (!slot || name == "-n" || name == "--nproc" || host_selection || name == "--master_port")
      rest.insert(rest.end(), {name, value});
  }
  return rest;
}

}  // namespace

DeepSpeedForms map_deepspeed_forms(const Args &args, bool launcher, const char *cuda_visible) {
  DeepSpeedForms f;
  Given g;
  Args rest = scan(args, launcher, g, f);
  if (!launcher) {
    f.args = std::move(rest);
    return f;
  }
  if (g.hostfile) {
    f.args = std::move(rest);
    map_master(g, &f);
    return f;
  }
  // One node: the host selection and --master_port are mapped, not kept.
  for (const char *o : {"--num_gpus", "--num_nodes", "--include", "--exclude", "--master_port"})
    for (auto it = rest.begin(); it != rest.end();) it = *it == o ? rest.erase(it, it + 2) : it + 1;
  if (g.num_nodes) {
    if (count_of("--num_nodes", *g.num_nodes, 1) != 1)
      throw UsageError("tessera run: --num_nodes " + *g.num_nodes +
                       " needs --hostfile (the nodes' names and slots; docs/multi-node.md)");
    f.notes.push_back("--num_nodes 1: this node");
  }
  // -n as given stays where it was; the devices' -n replaces an equal one.
  if (g.n && (g.num_gpus || g.include || g.exclude))
    for (auto it = rest.begin(); it != rest.end();)
      it = (*it == "-n" || *it == "--nproc") ? rest.erase(it, it + 2) : it + 1;
  f.args = std::move(rest);
  map_devices(g, cuda_visible, &f);
  map_master(g, &f);
  return f;
}

}  // namespace tessera::cli
