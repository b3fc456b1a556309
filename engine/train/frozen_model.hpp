// A checkpoint's model on its own: the model plugin built from the config
// the checkpoint's manifest holds, on the CPU, for a micro-batch of one,
// with no dataset opened (the sample shape comes from [data.train]'s
// TSR_EXT_DATASET_SHAPE), no ZeRO, optimizer or parameters. What
// `tessera ckpt export` asks for the model's own export, and the sample
// shape `tessera generate` builds its model for.
#pragma once

#include <tessera/tessera.h>

#include <memory>
#include <string>
#include <vector>

#include "host/host.hpp"
#include "train/job.hpp"

namespace tessera {

// The training samples' shape from [data.train]'s config, without opening
// the data (before ABI 1.2: its `context` and `vocab` values); a token
// window, int32 [T]. `where` and `purpose` go into the messages ("tessera
// generate needs ...").
tsr_data_info model_data_info(const Job &job, const std::string &where, const std::string &purpose);

// The job of a checkpoint's config (a step_ directory's manifest.json):
// one process on the CPU, batch 1, the DeepSpeed file already folded in.
Job checkpoint_job(const std::string &manifest_path, const std::string &config_text,
                   const std::vector<std::string> &plugin_paths);

class FrozenModel {
 public:
  // Builds [model] of `job`. A run's config may name files relative to the
  // directory the run started in, which the manifest does not record: where
  // the model cannot open a file from the current directory (TSR_ERR_IO),
  // each directory above `ckpt_dir` is tried in turn (a run's checkpoints
  // usually lie below its working directory).
  FrozenModel(Job job, const std::string &ckpt_dir);
  ~FrozenModel();
  FrozenModel(const FrozenModel &) = delete;
  FrozenModel &operator=(const FrozenModel &) = delete;

  const tsr_model_vtable *vt = nullptr;
  void *self = nullptr;
  std::string name;  // the plugin's
  Host &host() { return *host_; }

 private:
  Job job_;                     // holds the plugin libraries: destroyed last
  std::unique_ptr<Host> host_;  // before the job, after the model
  void create(const tsr_data_info &info);
};

}  // namespace tessera
