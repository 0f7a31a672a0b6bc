// rodeco::packed_linear_c, the fast engine's prepacked oneDNN linears called from the compiled step's graph without
// Python. A graph cannot hold a prepacked (opaque) weight, so it names one by a handle: rodeco.engines.compiled puts
// each linear's weight and bias under its handle, and drops them when the linear is freed. The call is oneDNN's
// own op (mkldnn::_linear_pointwise, as the eager engine calls it), reached through the dispatcher; what it saves
// is the Python a custom op in Python costs on every call (121 calls a step for SmolLM2).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <unordered_map>

namespace {

struct Linear {
  at::Tensor w;  // prepacked for oneDNN
  std::optional<at::Tensor> b;
};

std::mutex table_mutex;
std::unordered_map<int64_t, Linear>& table() {
  static std::unordered_map<int64_t, Linear> t;
  return t;
}

void put(int64_t handle, const at::Tensor& w, const std::optional<at::Tensor>& b) {
  std::lock_guard<std::mutex> lock(table_mutex);
  table()[handle] = Linear{w, b};
}

void drop(int64_t handle) {
  std::lock_guard<std::mutex> lock(table_mutex);
  table().erase(handle);
}

at::Tensor linear(const at::Tensor& x, int64_t handle) {
  Linear l;
  {
    std::lock_guard<std::mutex> lock(table_mutex);
    const auto it = table().find(handle);
    TORCH_CHECK(it != table().end(), "rodeco::packed_linear_c: no linear under handle ", handle,
                " (its weights were freed, or never put)");
    l = it->second;
  }
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                            c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>)>();
  return op.call(x, l.w, l.b, "none", c10::List<std::optional<at::Scalar>>(), "");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rodeco, m) {
  m.def("packed_linear_put(int handle, Tensor w, Tensor? b) -> ()", &put);
  m.def("packed_linear_drop(int handle) -> ()", &drop);
  m.def("packed_linear_c(Tensor x, int handle) -> Tensor");
}

TORCH_LIBRARY_IMPL(rodeco, CPU, m) { m.impl("packed_linear_c", &linear); }
