#include "plugin/layout.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <tessera/cpp/meminfo.hpp>
#include <thread>

#include "util/error.hpp"

namespace tessera {

namespace {

// The most elements a model may declare, in all.
constexpr uint64_t kMaxParamElements = uint64_t{1} << 40;

// Parameter i as the model declares it, checked: a name, 0..8 dimensions,
// each positive, at most 2^40 elements. Its place in the layout is the
// caller's.
ParamSlot declared_param(const tsr_model_vtable *vt, void *model, size_t i,
                         const std::string &model_name, uint32_t *group) {
  tsr_param_info info{};
  info.struct_size = tsr_param_info_STRUCT_SIZE;
  tsr_status st = vt->param_info(model, i, &info);
  TSR_CHECK(st == TSR_OK, st,
            "model '" + model_name + "': param_info(" + std::to_string(i) + ") failed");
  TSR_CHECK(info.name && *info.name, TSR_ERR_INVALID,
            "model '" + model_name + "': parameter " + std::to_string(i) + " has no name");
  TSR_CHECK(info.ndim >= 0 && info.ndim <= TSR_MAX_DIMS, TSR_ERR_INVALID,
            "model '" + model_name + "': parameter '" + info.name + "' has ndim " +
                std::to_string(info.ndim));
  ParamSlot p;
  p.name = info.name;
  p.numel = 1;
  for (int d = 0; d < info.ndim; ++d) {
    TSR_CHECK(info.shape[d] > 0, TSR_ERR_INVALID,
              "model '" + model_name + "': parameter '" + p.name + "' has a dimension <= 0");
    p.shape.push_back(info.shape[d]);
    // Bounded before anything is sized by it: 2^40 elements (4 TiB of
    // fp32) is beyond any model this engine trains, and keeps every
    // product and sum far from overflow.
    TSR_CHECK(static_cast<uint64_t>(info.shape[d]) <= kMaxParamElements / p.numel, TSR_ERR_CONFIG,
              "model '" + model_name + "': parameter '" + p.name +
                  "' has more than 2^40 elements (a dimension in [model] too large?)");
    p.numel *= static_cast<size_t>(info.shape[d]);
  }
  p.init = info.init;
  p.init_a = info.init_a;
  p.init_b = info.init_b;
  p.trainable = info.trainable != 0;
  p.decay = info.decay != 0;
  *group = info.group;
  return p;
}

// Before anything is sized by the layout: the parameters as fp32, once,
// are the least any rank holds in host memory (the initial values); a
// model past what the host has is refused here, not after minutes of
// swapping. (Each later buffer is checked as it is made: host.cpp.) The
// ranks on this host share its figure, each holding its own copy.
void check_fits_host(const Layout &L, const std::string &model_name, uint32_t local_ranks) {
  const uint64_t share = std::max<uint32_t>(local_ranks, 1);
  const sdk::HostMemory avail = sdk::host_memory_available();
  if (avail.bytes == 0 || L.total * 4 <= avail.bytes / share) return;
  const std::string shared =
      share > 1 ? ", shared by the " + std::to_string(share) + " ranks on this host" : "";
  throw Error(TSR_ERR_NO_MEMORY,
              "model '" + model_name + "': its " + std::to_string(L.numel) + " parameters need " +
                  sdk::format_bytes(static_cast<double>(L.total * 4)) + " (" +
                  std::to_string(L.total * 4) + " bytes) as fp32 at the least, more than the " +
                  sdk::format_bytes(static_cast<double>(avail.bytes / share)) + " (" +
                  std::to_string(avail.bytes / share) +
                  " bytes) of memory this host has available (" + avail.source + shared +
                  "); use a smaller model (or a host with more memory)");
}

}  // namespace

namespace {

// Declared parameters [begin, end) of one model group, the trainable ones
// (or the frozen ones) one after another from L's cursor as one layout
// group padded to a multiple of the world; nothing when there are none.
void place_group(Layout &L, size_t begin, size_t end, uint32_t model_group, bool frozen) {
  size_t size = 0;
  for (size_t i = begin; i < end; ++i)
    if (L.params[i].trainable != frozen) size += L.params[i].numel;
  if (size == 0) return;
  const uint32_t g = static_cast<uint32_t>(L.group_offset.size());
  L.group_offset.push_back(L.total);
  L.model_group.push_back(model_group);
  L.group_frozen.push_back(frozen ? 1 : 0);
  L.group_real.push_back(size);
  size_t cursor = L.total;
  for (size_t i = begin; i < end; ++i) {
    ParamSlot &p = L.params[i];
    if (p.trainable == frozen) continue;
    p.group = g;
    p.offset = cursor;
    cursor += p.numel;
  }
  const size_t padded = (size + L.world - 1) / L.world * L.world;
  L.group_size.push_back(padded);
  L.total += padded;
  if (frozen) L.frozen_total += padded;
}

}  // namespace

Layout make_layout(const tsr_model_vtable *vt, void *model, uint32_t world,
                   const std::string &model_name, uint32_t local_ranks) {
  Layout L;
  L.world = world;
  size_t n = vt->num_params(model);
  TSR_CHECK(n > 0, TSR_ERR_INVALID, "model '" + model_name + "' declares no parameters");
  std::vector<uint32_t> declared_group(n);
  for (size_t i = 0; i < n; ++i) {
    ParamSlot p = declared_param(vt, model, i, model_name, &declared_group[i]);
    for (const auto &q : L.params)
      TSR_CHECK(q.name != p.name, TSR_ERR_INVALID,
                "model '" + model_name + "': two parameters named '" + p.name + "'");
    TSR_CHECK(i == 0 || declared_group[i] >= declared_group[i - 1], TSR_ERR_INVALID,
              "model '" + model_name + "': parameter '" + p.name +
                  "' goes back to an earlier group; groups must not decrease");
    TSR_CHECK(L.numel + p.numel <= kMaxParamElements, TSR_ERR_CONFIG,
              "model '" + model_name +
                  "': its parameters add up to more than 2^40 elements "
                  "(a dimension in [model] too large?)");
    p.canonical = L.numel;
    L.numel += p.numel;
    if (p.trainable) L.trainable_numel += p.numel;
    L.params.push_back(std::move(p));
  }
  // Each model group: its trainable parameters, then its frozen ones.
  for (size_t begin = 0; begin < n;) {
    size_t end = begin;
    while (end < n && declared_group[end] == declared_group[begin]) ++end;
    place_group(L, begin, end, declared_group[begin], false);
    place_group(L, begin, end, declared_group[begin], true);
    begin = end;
  }
  check_fits_host(L, model_name, local_ranks);
  return L;
}

bool Layout::group_index(uint32_t model_group_id, uint32_t *first, uint32_t *last) const {
  auto lo = std::lower_bound(model_group.begin(), model_group.end(), model_group_id);
  if (lo == model_group.end() || *lo != model_group_id) return false;
  auto hi = std::upper_bound(lo, model_group.end(), model_group_id);
  *first = static_cast<uint32_t>(lo - model_group.begin());
  *last = static_cast<uint32_t>(hi - model_group.begin()) - 1;
  return true;
}

size_t Layout::group_of(size_t flat_offset) const {
  auto it = std::upper_bound(group_offset.begin(), group_offset.end(), flat_offset);
  TSR_CHECK(it != group_offset.begin(), TSR_ERR_INTERNAL, "flat offset before the first group");
  return static_cast<size_t>(it - group_offset.begin()) - 1;
}

std::vector<Layout::CanonicalPiece> Layout::to_canonical(size_t offset, size_t count) const {
  const size_t g = group_of(offset);
  TSR_CHECK(offset + count <= group_offset[g] + group_size[g], TSR_ERR_INTERNAL,
            "flat range crosses a group boundary");
  std::vector<CanonicalPiece> out;
  for (const auto &p : params) {
    if (p.group != g) continue;
    const size_t b = std::max(p.offset, offset), e = std::min(p.offset + p.numel, offset + count);
    if (b >= e) continue;
    const size_t c = p.canonical + (b - p.offset);
    if (!out.empty() && out.back().flat + out.back().count == b &&
        out.back().canonical + out.back().count == c)
      out.back().count += e - b;
    else
      out.push_back({b, c, e - b});
  }
  return out;
}

std::vector<tsr_segment> Layout::segments(size_t begin, size_t count) const {
  std::vector<tsr_segment> out;
  auto push = [&](size_t off, size_t cnt, int32_t decay) {
    if (cnt == 0) return;
    if (!out.empty() && out.back().decay == decay && out.back().offset + out.back().count == off) {
      out.back().count += cnt;
      return;
    }
    out.push_back(tsr_segment{off, cnt, decay});
  };
  size_t end = begin + count, pos = begin;
  for (const auto &p : params) {
    size_t pb = p.offset, pe = p.offset + p.numel;
    if (pe <= pos || pb >= end) continue;
    if (pb > pos) push(pos - begin, pb - pos, 0);  // padding before
    size_t b = std::max(pb, pos), e = std::min(pe, end);
    push(b - begin, e - b, (p.decay && p.trainable) ? 1 : 0);
    pos = e;
  }
  if (pos < end) push(pos - begin, end - pos, 0);
  return out;
}

namespace {

// Draws p's values in order from a generator seeded by its name, storing
// those `parts` (relative [first, last)) cover: a kept element gets the
// value it gets when everything is kept.
template <typename Draw>
void fill_parts(float *x, const std::vector<std::pair<size_t, size_t>> &parts, Draw draw) {
  size_t pos = 0;
  for (const auto &[a, b] : parts) {
    for (; pos < a; ++pos) draw();
    for (; pos < b; ++pos) x[pos] = draw();
  }
}

void init_one(const ParamSlot &p, float *flat, uint64_t seed, const std::vector<FlatRange> *keep) {
  // Seed from the name so a parameter's initial value is independent of
  // layout, world size and which thread fills it.
  uint64_t h = seed ^ 0xcbf29ce484222325ULL;
  for (char c : p.name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  std::mt19937_64 gen(h);
  float *x = flat + p.offset;
  const auto parts = kept_parts(keep, p.offset, p.numel);
  switch (p.init) {
    case TSR_INIT_ZEROS:
      for (const auto &[a, b] : parts) std::fill(x + a, x + b, 0.f);
      break;
    case TSR_INIT_ONES:
      for (const auto &[a, b] : parts) std::fill(x + a, x + b, 1.f);
      break;
    case TSR_INIT_NORMAL: {
      std::normal_distribution<float> d(p.init_a, p.init_b);
      fill_parts(x, parts, [&] { return d(gen); });
      break;
    }
    case TSR_INIT_UNIFORM: {
      std::uniform_real_distribution<float> d(p.init_a, p.init_b);
      fill_parts(x, parts, [&] { return d(gen); });
      break;
    }
    default:
      break;  // refused before any thread starts
  }
}

}  // namespace

std::vector<std::pair<size_t, size_t>> kept_parts(const std::vector<FlatRange> *keep, size_t offset,
                                                  size_t n) {
  if (!keep) return {{0, n}};
  std::vector<std::pair<size_t, size_t>> out;
  for (const FlatRange &r : *keep) {
    const size_t a = std::max(r.begin, offset), b = std::min(r.begin + r.count, offset + n);
    if (a < b) out.emplace_back(a - offset, b - offset);
  }
  return out;
}

std::vector<FlatRange> kept_ranges(const Layout &layout, bool partitioned, uint32_t rank) {
  if (!partitioned) return {FlatRange{0, layout.total}};
  std::vector<FlatRange> out;
  for (size_t g = 0; g < layout.group_offset.size(); ++g) {
    const size_t per = layout.group_size[g] / layout.world;
    out.push_back({layout.group_offset[g] + rank * per, per});
  }
  return out;
}

void init_params(const Layout &layout, float *flat, uint64_t seed,
                 const std::vector<FlatRange> *keep) {
  for (const auto &p : layout.params)
    if (p.init != TSR_INIT_ZEROS && p.init != TSR_INIT_ONES && p.init != TSR_INIT_NORMAL &&
        p.init != TSR_INIT_UNIFORM)
      throw Error(TSR_ERR_INVALID,
                  "parameter '" + p.name + "': unknown initialiser " + std::to_string(p.init));
  // One generator per parameter, so parameters fill in parallel with the
  // same values as one after another: largest first, one thread per core
  // (a 1.5B model's 1.5e9 normal draws took 40 s on one).
  std::vector<const ParamSlot *> order;
  for (const auto &p : layout.params) order.push_back(&p);
  std::sort(order.begin(), order.end(),
            [](const ParamSlot *a, const ParamSlot *b) { return a->numel > b->numel; });
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < order.size();) init_one(*order[i], flat, seed, keep);
  };
  const unsigned threads = std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()),
                                              static_cast<unsigned>(order.size()));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto &t : pool) t.join();
}

}  // namespace tessera
