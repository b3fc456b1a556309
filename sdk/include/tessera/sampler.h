/* Kind tessera.sampler/1: which sample indices each rank sees, per epoch. */
#ifndef TESSERA_SAMPLER_H
#define TESSERA_SAMPLER_H

#include <tessera/host.h>

typedef struct tsr_sampler_args {
  size_t struct_size;
  int64_t dataset_size;
  uint32_t rank;
  uint32_t world_size;
  int64_t epoch;
  uint64_t seed;
} tsr_sampler_args;
#define tsr_sampler_args_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_sampler_args, seed)

typedef struct tsr_sampler_vtable {
  size_t struct_size;
  tsr_status (*create)(const tsr_host *host, const tsr_config *cfg, void **out_self);
  void (*destroy)(void *self);
  /* How many indices this rank gets in one epoch. */
  tsr_status (*epoch_size)(void *self, const tsr_sampler_args *args, int64_t *out);
  /* Write this rank's epoch_size indices, in the order they are visited. */
  tsr_status (*indices)(void *self, const tsr_sampler_args *args, int64_t *out);
} tsr_sampler_vtable;
#define tsr_sampler_vtable_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_sampler_vtable, indices)

#endif /* TESSERA_SAMPLER_H */
