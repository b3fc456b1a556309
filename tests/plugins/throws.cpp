// throws: optimizer "thrower", a C++ plugin (its entry point is ordinary)
// whose create and step throw on request, always inside sdk::guard, so what
// reaches the host is a status code and a message, never an exception.
//   create_throws: "nothing" (create succeeds), "std" (std::runtime_error),
//                  "other" (an exception not derived from std::exception),
//                  "sdk" (sdk::Error with TSR_ERR_CONFIG), "nomem"
//                  (std::bad_alloc), "host" (a failing host call: reads an
//                  undeclared config key)
//   step_throws:   "std" (std::runtime_error) or "other"
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <tessera/cpp/plugin.hpp>

namespace {

namespace sdk = tessera::sdk;

// Not a std::exception: only guard's catch-all can stop it.
struct Gremlin {
  int mischief = 42;
};

struct Thrower {
  const tsr_host *host = nullptr;
  std::string step_throws;
};

tsr_status thrower_create(const tsr_host *host, const tsr_config *cfg, void **out_self) {
  if (out_self) *out_self = nullptr;
  return sdk::guard(host, [&] {
    if (!out_self) throw sdk::Error(TSR_ERR_INVALID, "thrower: out_self is NULL");
    sdk::Config c(host, cfg);
    std::string what = c.get_string("create_throws");
    if (what == "std") throw std::runtime_error("thrower: create blew up");
    if (what == "other") throw Gremlin{};
    if (what == "sdk") throw sdk::Error(TSR_ERR_CONFIG, "thrower: create refused on request");
    if (what == "nomem") throw std::bad_alloc();
    if (what == "host") (void)c.get_float("no_such_key");
    auto self = std::make_unique<Thrower>();
    self->host = host;
    self->step_throws = c.get_string("step_throws");
    *out_self = self.release();
  });
}

void thrower_destroy(void *self) {
  delete static_cast<Thrower *>(self);
}

uint32_t thrower_state_count(void *) {
  return 0;
}

const char *thrower_state_name(void *, uint32_t) {
  return nullptr;
}

tsr_status thrower_step(void *self, const tsr_optimizer_step_args *) {
  auto *s = static_cast<Thrower *>(self);
  return sdk::guard(s->host, [&] {
    if (s->step_throws == "std") throw std::runtime_error("thrower: step blew up");
    throw Gremlin{};
  });
}

const tsr_param_decl kParams[] = {
    sdk::param_choice("create_throws", "\"nothing\"", "what create throws",
                      "nothing|std|other|sdk|nomem|host"),
    sdk::param_choice("step_throws", "\"std\"", "what step throws", "std|other"),
};

const tsr_optimizer_vtable kVtable = {
    sizeof(tsr_optimizer_vtable), thrower_create,     thrower_destroy,
    thrower_state_count,          thrower_state_name, thrower_step};

const tsr_plugin_descriptor kDescriptor = {sizeof(tsr_plugin_descriptor),
                                           TSR_KIND_OPTIMIZER,
                                           "thrower",
                                           "1.0.0",
                                           "throws from create and step, inside sdk::guard",
                                           kParams,
                                           sizeof(kParams) / sizeof(kParams[0]),
                                           TSR_DEVICE_CPU,
                                           &kVtable,
                                           nullptr};
const tsr_plugin_descriptor *const kPlugins[] = {&kDescriptor};
const tsr_plugin_library kLibrary = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                     kPlugins, 1};

}  // namespace

TSR_PLUGIN_ENTRY {
  return &kLibrary;
}
