/* create_fails: optimizer "twin-turbo", whose create refuses a config the
 * declared parameters allow (warp = 0, the default) with TSR_ERR_CONFIG and
 * its own message through host->error. With a positive warp it is created. */
#include <stdio.h>
#include <tessera/optimizer.h>

#include "stub_optimizer.h"

static tsr_status turbo_create(const tsr_host *host, const tsr_config *cfg, void **out_self) {
  double warp = 0;
  char msg[128];
  tsr_status s;
  if (!out_self) return host->error(host->ctx, TSR_ERR_INVALID, "twin-turbo: out_self is NULL");
  *out_self = NULL;
  if ((s = host->config_float(cfg, "warp", &warp)) != TSR_OK) return s;
  if (!(warp > 0)) {
    snprintf(msg, sizeof msg, "twin-turbo needs a positive warp factor (got %g)", warp);
    return host->error(host->ctx, TSR_ERR_CONFIG, msg);
  }
  return tsr_test_stub_create(host, cfg, out_self);
}

static const tsr_param_decl turbo_params[] = {
    {sizeof(tsr_param_decl), "warp", TSR_PARAM_FLOAT, "0.0", "warp factor; must be positive", 0,
     0.0, 0, 0.0, NULL},
};

static const tsr_optimizer_vtable turbo_vtable = {
    sizeof(tsr_optimizer_vtable), turbo_create,
    tsr_test_stub_destroy,        tsr_test_stub_state_count,
    tsr_test_stub_state_name,     tsr_test_stub_step};

static const tsr_plugin_descriptor turbo_descriptor = {
    sizeof(tsr_plugin_descriptor),
    TSR_KIND_OPTIMIZER,
    "twin-turbo",
    "1.0.0",
    "refuses to start without a positive warp factor",
    turbo_params,
    1,
    TSR_DEVICE_CPU,
    &turbo_vtable,
    NULL};
static const tsr_plugin_descriptor *const plugins[] = {&turbo_descriptor};
static const tsr_plugin_library library = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                           plugins, 1};

TSR_PLUGIN_ENTRY {
  return &library;
}
