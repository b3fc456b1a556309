// The flat layout of a model's parameters: one buffer, group after group,
// each group padded to a multiple of the world size so rank r can own
// slice r of every group (docs/architecture.md, "State: the flat layout").
// A model group holding both trainable and frozen parameters becomes two
// layout groups, its trainable parameters first, so the frozen ones form
// groups of their own that get no gradient, optimizer state or master copy
// (docs/architecture.md, "Frozen parameters").
#pragma once

#include <tessera/model.h>
#include <tessera/optimizer.h>

#include <string>
#include <utility>
#include <vector>

namespace tessera {

struct ParamSlot {
  std::string name;
  std::vector<int64_t> shape;
  uint32_t group = 0;
  size_t offset = 0;     // element offset in the flat buffer
  size_t canonical = 0;  // element offset in the canonical space (declaration order)
  size_t numel = 0;
  tsr_init init = TSR_INIT_ZEROS;
  float init_a = 0, init_b = 0;
  bool trainable = true, decay = true;
};

struct Layout {
  std::vector<ParamSlot> params;
  std::vector<size_t> group_offset, group_size;  // padded sizes
  size_t total = 0;                              // padded elements
  size_t numel = 0;                              // real parameters
  size_t trainable_numel = 0;
  uint32_t world = 1;
  // Per layout group: 1 when every parameter in it is frozen (trainable =
  // 0). A model group with both kinds is split, so a group is all one or
  // all the other.
  std::vector<int32_t> group_frozen;
  // Padded elements of the frozen groups (the rest are trainable).
  size_t frozen_total = 0;

  // Runs of equal decay flag inside [begin, begin + count), relative to
  // begin. Padding and frozen parameters get decay 0 (their gradient is 0).
  std::vector<tsr_segment> segments(size_t begin, size_t count) const;

  // The canonical index space: every parameter's elements in declaration
  // order, without padding. It depends neither on the world size nor on
  // which parameters are frozen, so checkpoints are stored in it.
  // `group_real[g]` is group g's unpadded size.
  std::vector<size_t> group_real;
  // The canonical intervals covered by flat [offset, offset + count), which
  // must lie within one group, in flat order: one per run of parameters
  // that are neighbours in both spaces (a split model group's parameters
  // are not); padding maps to nothing.
  struct CanonicalPiece {
    size_t flat = 0, canonical = 0, count = 0;
  };
  std::vector<CanonicalPiece> to_canonical(size_t offset, size_t count) const;
  size_t group_of(size_t flat_offset) const;
  // The model's own group numbers, one per layout group (non-decreasing,
  // gaps allowed; a split model group's number twice), and the layout
  // groups [*first, *last] a model number names.
  std::vector<uint32_t> model_group;
  bool group_index(uint32_t model_group_id, uint32_t *first, uint32_t *last) const;
};

// Reads the model's declared parameters and lays them out for `world` ranks;
// `local_ranks` of them share this host's memory (its check below).
Layout make_layout(const tsr_model_vtable *vt, void *model, uint32_t world,
                   const std::string &model_name, uint32_t local_ranks = 1);

// A run of flat elements [begin, begin + count).
struct FlatRange {
  size_t begin = 0, count = 0;
};

// The parts of flat [offset, offset + n) that `keep` (sorted, disjoint
// ranges; null: everything) covers, as [first, last) relative to offset.
std::vector<std::pair<size_t, size_t>> kept_parts(const std::vector<FlatRange> *keep, size_t offset,
                                                  size_t n);

// The flat ranges a rank keeps of the parameters: all of them, or with
// `partitioned` (ZeRO stage 3) slice `rank` of every group (zero.h),
// frozen groups included.
std::vector<FlatRange> kept_ranges(const Layout &layout, bool partitioned, uint32_t rank);

// Fills the flat fp32 buffer with each parameter's initialiser, from a
// generator seeded per parameter name so the result does not depend on the
// layout or the world size. With `keep`, only the elements it covers are
// written (the same values they get without it); the others are not
// touched, so a rank that keeps a slice never faults in the rest.
void init_params(const Layout &layout, float *flat, uint64_t seed,
                 const std::vector<FlatRange> *keep = nullptr);

}  // namespace tessera
