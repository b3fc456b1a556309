// `[model] init_from`: start from another model's weights. Any model plugin
// that declares a string key `init_from` gets it: the engine reads the
// safetensors file (or DIR/model.safetensors, as Hugging Face's
// save_pretrained writes it; or the shards that a Hugging Face
// model.safetensors.index.json names, given or in DIR without a
// model.safetensors) and copies each tensor whose name is a
// declared parameter over the declared initialiser's values.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "plugin/layout.hpp"

namespace tessera {

// Overwrites the parameters of `layout` in `flat` (fp32, flat layout) with
// the file's tensors of the same names. F32, F16, BF16 and F64 tensors convert.
// A tensor with fewer rows than its parameter fills the first rows (a
// vocabulary padded for speed keeps its initialised padding rows); any other
// shape difference, or a declared parameter the file lacks, is an error
// naming the file and the tensor. Tensors the model does not declare are
// skipped (counted in the returned message). Returns a one-line summary.
//
// The files are memory-mapped and read tensor by tensor, each tensor's
// pages dropped once converted: the loader adds at most one tensor of the
// file to what the process holds. With `keep` (kept_ranges: a ZeRO stage
// that partitions parameters keeps slice `rank` of each group), only those
// elements of `flat` are written and only their bytes of the file read.
// `may_lack(i)` true: parameter i need not be in the file and keeps its
// initialised values when it is not (a model's LoRA adapters over a base
// model's file; the model says which, ABI 1.8's init-from `may_lack`).
std::string init_from_safetensors(const std::string &path, const Layout &layout, float *flat,
                                  const std::vector<FlatRange> *keep = nullptr,
                                  const std::function<bool(size_t)> &may_lack = {});

}  // namespace tessera
