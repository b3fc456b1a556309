// A model plugin's function table (tsr_model_vtable) built from a C++ class,
// every entry guarded, so a plugin writes its model and not the glue:
//
//   struct MyModel {
//     static constexpr const char *kName = "my_model";  // for messages
//     const tsr_host *host;
//     std::vector<tsr_param_info> infos;                 // declared parameters
//     void forward(tsr_step *, const tsr_batch *, int32_t training, tsr_forward_result *);
//     void backward(tsr_step *, const tsr_batch *, float loss_scale);
//     double flops_per_sample() const;                   // optional
//     void predict(tsr_step *, const tsr_batch *, DLTensor *logits);  // optional
//   };
//   MyModel *build(const tsr_host *, const tsr_config *, const tsr_model_init *);
//     // (or std::unique_ptr<MyModel>; entries.hpp has what every kind shares)
//   const tsr_model_vtable kVtable = sdk::model_vtable<MyModel, build>();
//
// param_info copies at most the host's struct_size bytes (sdk::copy_out), as
// the struct_size rule asks of a callee that fills a caller's struct.
#pragma once

#include <tessera/tessera.h>

#include <string>
#include <tessera/cpp/entries.hpp>
#include <tessera/cpp/plugin.hpp>
#include <tessera/cpp/struct_size.hpp>

namespace tessera::sdk {

template <typename M, auto Build>
struct ModelEntries {
  static size_t num_params(void *self) {
    return entries::value<M>(self, size_t{0}, [](M &m) { return m.infos.size(); });
  }

  static tsr_status param_info(void *self, size_t index, tsr_param_info *out) {
    return entries::call<M>(self, [&](M &m) {
      if (!out) throw Error(TSR_ERR_INVALID, std::string(M::kName) + ": param_info out is NULL");
      if (index >= m.infos.size())
        throw Error(TSR_ERR_INVALID, std::string(M::kName) + ": parameter index " +
                                         std::to_string(index) + " out of range (the model has " +
                                         std::to_string(m.infos.size()) + ")");
      copy_out(m.infos[index], out);
    });
  }

  static tsr_status forward(void *self, tsr_step *step, const tsr_batch *batch, int32_t training,
                            tsr_forward_result *out) {
    return entries::call<M>(self, [&](M &m) { m.forward(step, batch, training, out); });
  }

  static tsr_status backward(void *self, tsr_step *step, const tsr_batch *batch, float loss_scale) {
    return entries::call<M>(self, [&](M &m) { m.backward(step, batch, loss_scale); });
  }

  static double flops_per_sample(void *self) {
    const M *m = static_cast<const M *>(self);
    return m ? m->flops_per_sample() : 0.0;
  }

  static tsr_status predict(void *self, tsr_step *step, const tsr_batch *batch, DLTensor *logits) {
    return entries::call<M>(self, [&](M &m) { m.predict(step, batch, logits); });
  }
};

// The table for M: flops_per_sample and predict only where M has them (a
// NULL entry tells the host the model offers neither).
template <typename M, auto Build>
constexpr tsr_model_vtable model_vtable() {
  using E = ModelEntries<M, Build>;
  tsr_model_vtable t{tsr_model_vtable_STRUCT_SIZE,
                     &entries::create_from<M, Build, const tsr_model_init *>,
                     &entries::destroy<M>,
                     &E::num_params,
                     &E::param_info,
                     &E::forward,
                     &E::backward,
                     nullptr,
                     nullptr};
  if constexpr (requires(const M &m) { m.flops_per_sample(); })
    t.flops_per_sample = &E::flops_per_sample;
  if constexpr (requires(M & m) { m.predict(nullptr, nullptr, nullptr); }) t.predict = &E::predict;
  return t;
}

}  // namespace tessera::sdk
