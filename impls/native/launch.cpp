// normdiff's native call path (impls/native/__init__.py): a kernel's recorded launches replayed
// from C++, so a warm call costs one signature lookup, the output allocations and one
// cuLaunchKernel per recorded kernel, with no Python in between. A launch recorded with
// programmatic dependent launch (PDL) is replayed with its attribute, through cuLaunchKernelEx.
//
// The CUDA driver is opened at run time (dlopen, driver.cpp), so this builds against any torch,
// CPU-only ones included, and needs no CUDA toolkit. The current stream comes from torch itself
// (torch._C._cuda_getCurrentRawStream), so no CUDA library of torch is linked either.
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

#include "driver.cpp"  // the driver's types and entry points, and read_graph

namespace {

// Where a replayed parameter's value comes from: the call's tensors' data pointers, or its eps.
enum Source : int { X = 0, W = 1, B = 2, Y = 3, MEAN = 4, RSTD = 5, EPS = 6 };

struct Launch {
  CUfunction func;
  unsigned grid[3], block[3], smem;
  bool pdl = false;  // replayed with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
  LaunchAttribute attr{};
  std::vector<unsigned char> params;  // every parameter's bytes at its offset, as recorded
  std::vector<size_t> offsets;
  std::vector<std::pair<size_t, int>> subs;  // (byte offset, Source)
  std::vector<void*> args;  // pointers into params, one per parameter
};

LaunchAttribute programmatic_attribute() {
  LaunchAttribute a{};
  a.id = kAttrProgrammatic;
  a.value.programmaticStreamSerializationAllowed = 1;
  return a;
}

// The cuLaunchKernelEx configuration of a PDL launch on ``stream``: its shape and its attribute.
LaunchConfig launch_config(Launch& l, CUstream stream) {
  return LaunchConfig{l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.smem, stream,
                      &l.attr, 1};
}

struct Plan {
  CUcontext ctx;
  py::object device_index;  // the device, as a Python int for torch's current-stream query
  std::vector<Launch> launches;
  std::vector<py::object> keep;  // tensors whose memory a launch refers to (placeholders)
};

// The signature of a call: what the validated call's judgement depends on (impls/fastpath.py).
void add_tensor_key(std::vector<int64_t>& key, PyObject* obj) {
  if (obj == Py_None) {
    key.push_back(-1);
    return;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  key.push_back(t.dim());
  for (int64_t s : t.sizes()) key.push_back(s);
  for (int64_t s : t.strides()) key.push_back(s);
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(static_cast<int64_t>(t.device().type()) * 1024 + t.device().index());
  key.push_back(reinterpret_cast<uintptr_t>(t.data_ptr()) & 15);
}

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const {
    size_t h = k.size();
    for (int64_t v : k) h ^= static_cast<size_t>(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};

class PlanTable {
 public:
  // ``pdl_state``: impls.pdl's switch (a dict whose "generation" every change of the switch
  // bumps), read on each call without calling into Python: plans recorded under another
  // generation may launch with PDL where the switch now says not, or the other way round.
  PlanTable(py::object outputs_cls, bool want_mean, bool want_rstd, double default_eps, py::object tensor_type,
            py::object hooks, size_t limit, py::dict pdl_state)
      : outputs_cls_(std::move(outputs_cls)), want_mean_(want_mean), want_rstd_(want_rstd),
        default_eps_(default_eps), tensor_type_(std::move(tensor_type)), hooks_(std::move(hooks)), limit_(limit),
        pdl_state_(std::move(pdl_state)) {
    generation_key_ = py::reinterpret_steal<py::object>(PyUnicode_InternFromString("generation"));
    generation_ = switch_generation();
    py::module_ c = py::module_::import("torch._C");
    raw_stream_ = py::getattr(c, "_cuda_getCurrentRawStream", py::none());  // absent from CPU-only torch
    object_new_ = py::module_::import("builtins").attr("object").attr("__new__");
    for (int i = 0; i < 3; ++i) field_[i] = py::reinterpret_steal<py::object>(PyUnicode_InternFromString(kFields[i]));
    for (int i = 0; i < 2; ++i) hook_[i] = py::reinterpret_steal<py::object>(PyUnicode_InternFromString(kHooks[i]));
    calls_ = py::reinterpret_steal<py::object>(PyUnicode_InternFromString("calls"));
  }

  // The outputs of a warm call, or None where the call must take the validated path.
  py::object call(py::handle x, py::handle w, py::handle b, py::handle eps_obj) {
    PyObject* tensor_type = tensor_type_.ptr();
    if (reinterpret_cast<PyObject*>(Py_TYPE(x.ptr())) != tensor_type) return py::none();
    for (py::handle p : {w, b})
      if (!p.is_none() && reinterpret_cast<PyObject*>(Py_TYPE(p.ptr())) != tensor_type) return py::none();
    double eps = default_eps_;
    if (!eps_obj.is_none()) {
      if (!PyFloat_CheckExact(eps_obj.ptr())) return py::none();  // the validated call judges it
      eps = PyFloat_AS_DOUBLE(eps_obj.ptr());
      if (!(eps >= 0.0 && eps < INFINITY)) return py::none();
    }
    key_.clear();
    add_tensor_key(key_, x.ptr());
    add_tensor_key(key_, w.ptr());
    add_tensor_key(key_, b.ptr());
    if (plans_.empty()) return py::none();
    if (switch_generation() != generation_) {  // the PDL switch changed: every plan is stale
      plans_.clear();
      return py::none();
    }
    auto found = plans_.find(key_);
    if (found == plans_.end() || !hooks_idle()) return py::none();
    Plan& plan = found->second;
    CUcontext ctx = nullptr;
    if (driver().ctx_current(&ctx) != 0 || ctx != plan.ctx) return py::none();  // another device is current
    const at::Tensor& xt = THPVariable_Unpack(x.ptr());
    at::Tensor y = at::empty(xt.sizes(), xt.options());
    at::Tensor mean, rstd;
    auto lead = xt.sizes().slice(0, xt.dim() - 1);
    if (want_mean_) mean = at::empty(lead, xt.options().dtype(at::kFloat));
    if (want_rstd_) rstd = at::empty(lead, xt.options().dtype(at::kFloat));
    uint64_t values[7] = {
        reinterpret_cast<uint64_t>(xt.data_ptr()),
        w.is_none() ? 0 : reinterpret_cast<uint64_t>(THPVariable_Unpack(w.ptr()).data_ptr()),
        b.is_none() ? 0 : reinterpret_cast<uint64_t>(THPVariable_Unpack(b.ptr()).data_ptr()),
        reinterpret_cast<uint64_t>(y.data_ptr()),
        want_mean_ ? reinterpret_cast<uint64_t>(mean.data_ptr()) : 0,
        want_rstd_ ? reinterpret_cast<uint64_t>(rstd.data_ptr()) : 0,
        0};
    float eps32 = static_cast<float>(eps);
    std::memcpy(&values[EPS], &eps32, sizeof eps32);
    PyObject* s = PyObject_CallOneArg(raw_stream_.ptr(), plan.device_index.ptr());
    if (!s) throw py::error_already_set();
    CUstream stream = reinterpret_cast<CUstream>(PyLong_AsUnsignedLongLong(s));
    Py_DECREF(s);
    for (Launch& l : plan.launches) {
      for (auto& [offset, src] : l.subs)
        std::memcpy(l.params.data() + offset, &values[src], src == EPS ? sizeof(float) : sizeof(uint64_t));
      if (l.pdl) {
        LaunchConfig config = launch_config(l, stream);
        check(driver().launch_ex(&config, l.func, l.args.data(), nullptr), "cuLaunchKernelEx");
      } else {
        check(driver().launch(l.func, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.smem,
                              stream, l.args.data(), nullptr),
              "cuLaunchKernel");
      }
    }
    // The outputs object without running its Python __init__ (a dataclass's costs a microsecond).
    py::object result = py::reinterpret_steal<py::object>(PyObject_CallOneArg(object_new_.ptr(), outputs_cls_.ptr()));
    if (!result) throw py::error_already_set();
    py::object values_out[3] = {
        py::reinterpret_steal<py::object>(THPVariable_Wrap(y)),
        want_mean_ ? py::reinterpret_steal<py::object>(THPVariable_Wrap(mean)) : py::none(),
        want_rstd_ ? py::reinterpret_steal<py::object>(THPVariable_Wrap(rstd)) : py::none()};
    for (int i = 0; i < 3; ++i)
      if (PyObject_GenericSetAttr(result.ptr(), field_[i].ptr(), values_out[i].ptr()) != 0) throw py::error_already_set();
    return result;
  }

  // A plan for the signature of (x, w, b), recorded under the PDL switch's current generation:
  // launches as read_graph returned them, with each parameter's source (-1: the recorded bytes)
  // in ``sources`` and whether it replays with PDL (impls.native decides) per launch.
  void add(py::handle x, py::handle w, py::handle b, int64_t device, py::list launches, py::list keep) {
    std::vector<int64_t> key;
    add_tensor_key(key, x.ptr());
    add_tensor_key(key, w.ptr());
    add_tensor_key(key, b.ptr());
    Plan plan;
    plan.device_index = py::int_(device);
    for (py::handle item : launches) {
      py::tuple t = item.cast<py::tuple>();
      Launch l;
      l.func = reinterpret_cast<CUfunction>(t[0].cast<uintptr_t>());
      auto grid = t[1].cast<std::vector<unsigned>>(), block = t[2].cast<std::vector<unsigned>>();
      for (int i = 0; i < 3; ++i) l.grid[i] = grid[i], l.block[i] = block[i];
      l.smem = t[3].cast<unsigned>();
      std::string bytes = t[4].cast<std::string>();
      l.params.assign(bytes.begin(), bytes.end());
      l.offsets = t[5].cast<std::vector<size_t>>();
      auto sources = t[6].cast<std::vector<int>>();
      for (size_t i = 0; i < l.offsets.size(); ++i)
        if (sources[i] >= 0) l.subs.emplace_back(l.offsets[i], sources[i]);
      l.pdl = t[7].cast<bool>();
      if (l.pdl && !driver().launch_ex)  // cuLaunchKernel would drop the attribute
        throw std::runtime_error("a PDL launch, and the driver has no cuLaunchKernelEx to replay it with "
                                 "its attribute");
      if (l.pdl) l.attr = programmatic_attribute();
      plan.launches.push_back(std::move(l));
    }
    if (!driver().error.empty()) throw std::runtime_error(driver().error);
    check(driver().ctx_current(&plan.ctx), "cuCtxGetCurrent");
    int64_t now = switch_generation();
    if (now != generation_ || plans_.size() >= limit_) plans_.clear();  // stale, or full: cleared, not searched
    generation_ = now;
    for (Launch& l : plan.launches)  // after the moves: pointers into each launch's own bytes
      for (size_t off : l.offsets) l.args.push_back(l.params.data() + off);
    for (py::handle k : keep) plan.keep.push_back(py::reinterpret_borrow<py::object>(k));
    plans_[key] = std::move(plan);
  }

  size_t size() const { return plans_.size(); }
  void clear() { plans_.clear(); }
  // Whether the plans were recorded under the PDL switch as it is now.
  bool current() { return switch_generation() == generation_; }
  // Per plan, whether each of its launches replays with PDL (tests, tools).
  py::list pdl_flags() const {
    py::list out;
    for (const auto& [key, plan] : plans_) {
      py::list flags;
      for (const Launch& l : plan.launches) flags.append(l.pdl);
      out.append(py::tuple(flags));
    }
    return out;
  }

 private:
  int64_t switch_generation() {
    PyObject* value = PyDict_GetItemWithError(pdl_state_.ptr(), generation_key_.ptr());
    if (!value) {
      if (PyErr_Occurred()) throw py::error_already_set();
      throw std::runtime_error("impls.pdl's switch holds no generation");
    }
    int64_t g = PyLong_AsLongLong(value);
    if (g == -1 && PyErr_Occurred()) throw py::error_already_set();
    return g;
  }

  // Triton's launch hooks (a profiler) must see every launch: while one is set, calls go the
  // Python way. Triton 3.6 keeps empty hook chains (falsy .calls), older releases None.
  bool hooks_idle() {
    if (hooks_.is_none()) return true;
    for (const py::object& name : hook_) {
      py::object hook = py::reinterpret_steal<py::object>(PyObject_GetAttr(hooks_.ptr(), name.ptr()));
      if (!hook) throw py::error_already_set();
      if (hook.is_none()) continue;
      py::object calls = py::reinterpret_steal<py::object>(PyObject_GetAttr(hook.ptr(), calls_.ptr()));
      if (!calls) {
        PyErr_Clear();
        return false;  // a hook of another kind: it must see the launch
      }
      if (PyObject_IsTrue(calls.ptr())) return false;
    }
    return true;
  }

  static constexpr const char* kFields[3] = {"y", "mean", "rstd"};
  static constexpr const char* kHooks[2] = {"launch_enter_hook", "launch_exit_hook"};
  py::object outputs_cls_;
  bool want_mean_, want_rstd_;
  double default_eps_;
  py::object tensor_type_, hooks_, raw_stream_, object_new_, calls_;
  py::object field_[3], hook_[2];
  size_t limit_;
  py::dict pdl_state_;
  py::object generation_key_;
  int64_t generation_ = 0;
  std::unordered_map<std::vector<int64_t>, Plan, KeyHash> plans_;
  std::vector<int64_t> key_;
};

// The raw cuLaunchKernelEx arguments a replay passes for a PDL launch of this shape: the
// CUlaunchConfig's bytes (its attrs pointer zeroed) and its attribute's (tests compare both with
// cuda.h's structs).
py::tuple pdl_launch_config(std::vector<unsigned> grid, std::vector<unsigned> block, unsigned smem, uintptr_t stream) {
  Launch l{};
  for (int i = 0; i < 3; ++i) l.grid[i] = grid.at(i), l.block[i] = block.at(i);
  l.smem = smem;
  l.pdl = true;
  l.attr = programmatic_attribute();
  LaunchConfig config = launch_config(l, reinterpret_cast<CUstream>(stream));
  if (config.attrs != &l.attr) throw std::runtime_error("the configuration does not carry the launch's attribute");
  config.attrs = nullptr;
  return py::make_tuple(py::bytes(reinterpret_cast<const char*>(&config), sizeof config),
                        py::bytes(reinterpret_cast<const char*>(&l.attr), sizeof l.attr));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<PlanTable>(m, "PlanTable")
      .def(py::init<py::object, bool, bool, double, py::object, py::object, size_t, py::dict>())
      .def("__call__", &PlanTable::call)
      .def("add", &PlanTable::add)
      .def("__len__", &PlanTable::size)
      .def("clear", &PlanTable::clear)
      .def("current", &PlanTable::current)
      .def("pdl_flags", &PlanTable::pdl_flags);
  m.def("read_graph", &read_graph, py::arg("graph"), py::arg("lead") = 0);
  m.def("is_device_pointer", &is_device_pointer);
  m.def("driver_error", &driver_error);
  m.def("driver_features", &driver_features);
  m.def("pdl_launch_config", &pdl_launch_config);
}
