/* Everything a plugin author needs: the ABI basics, the host table, and the
 * function table of every plugin kind. */
#ifndef TESSERA_TESSERA_H
#define TESSERA_TESSERA_H

#include <tessera/abi.h>
#include <tessera/dataset.h>
#include <tessera/extensions.h>
#include <tessera/host.h>
#include <tessera/model.h>
#include <tessera/offload.h>
#include <tessera/ops.h>
#include <tessera/optimizer.h>
#include <tessera/sampler.h>
#include <tessera/zero.h>

#endif /* TESSERA_TESSERA_H */
