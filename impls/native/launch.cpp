// normdiff's native call path (impls/native/__init__.py): a kernel's recorded launches replayed
// from C++, so a warm call costs one signature lookup, the output allocations and one
// cuLaunchKernel per recorded kernel, with no Python in between.
//
// The CUDA driver is opened at run time (dlopen), so this builds against any torch, CPU-only
// ones included, and needs no CUDA toolkit. The current stream comes from torch itself
// (torch._C._cuda_getCurrentRawStream), so no CUDA library of torch is linked either.
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

// -- the driver API, as far as used -----------------------------------------------------------
using CUresult = int;
using CUfunction = void*;
using CUstream = void*;
using CUgraph = void*;
using CUgraphNode = void*;
using CUcontext = void*;

struct KernelNodeParams {  // CUDA_KERNEL_NODE_PARAMS_v2
  CUfunction func;
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  void** kernelParams;
  void** extra;
  void* kern;
  CUcontext ctx;
};

constexpr int kNodeKernel = 0;          // CU_GRAPH_NODE_TYPE_KERNEL
constexpr int kAttrCooperative = 2;     // CU_LAUNCH_ATTRIBUTE_COOPERATIVE
constexpr int kAttrClusterDim = 4;      // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
constexpr int kAttrPreferredCluster = 11;  // CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION
constexpr int kFuncClusterMustBeSet = 10;  // CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET

union LaunchAttributeValue {  // CUlaunchAttributeValue
  char pad[64];
  int cooperative;
  struct {
    unsigned int x, y, z;
  } clusterDim;
};
constexpr int kPointerMemoryType = 2;   // CU_POINTER_ATTRIBUTE_MEMORY_TYPE

struct Driver {
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     CUstream, void**, void**) = nullptr;
  CUresult (*ctx_current)(CUcontext*) = nullptr;
  CUresult (*graph_nodes)(CUgraph, CUgraphNode*, size_t*) = nullptr;
  CUresult (*graph_edges)(CUgraph, CUgraphNode*, CUgraphNode*, size_t*) = nullptr;
  CUresult (*node_type)(CUgraphNode, int*) = nullptr;
  CUresult (*kernel_params)(CUgraphNode, KernelNodeParams*) = nullptr;
  CUresult (*param_info)(CUfunction, size_t, size_t*, size_t*) = nullptr;
  CUresult (*pointer_attribute)(void*, int, unsigned long long) = nullptr;
  CUresult (*node_attribute)(CUgraphNode, int, LaunchAttributeValue*) = nullptr;
  CUresult (*func_attribute)(int*, int, CUfunction) = nullptr;
  std::string error;

  Driver() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      error = "libcuda.so.1 not loadable (no NVIDIA driver)";
      return;
    }
    auto get = [&](const char* name) {
      void* f = dlsym(lib, name);
      if (!f && error.empty()) error = std::string("the driver lacks ") + name;
      return f;
    };
    launch = reinterpret_cast<decltype(launch)>(get("cuLaunchKernel"));
    ctx_current = reinterpret_cast<decltype(ctx_current)>(get("cuCtxGetCurrent"));
    graph_nodes = reinterpret_cast<decltype(graph_nodes)>(get("cuGraphGetNodes"));
    graph_edges = reinterpret_cast<decltype(graph_edges)>(get("cuGraphGetEdges"));
    node_type = reinterpret_cast<decltype(node_type)>(get("cuGraphNodeGetType"));
    kernel_params = reinterpret_cast<decltype(kernel_params)>(get("cuGraphKernelNodeGetParams_v2"));
    param_info = reinterpret_cast<decltype(param_info)>(get("cuFuncGetParamInfo"));  // CUDA 12.4+
    pointer_attribute = reinterpret_cast<decltype(pointer_attribute)>(get("cuPointerGetAttribute"));
    node_attribute = reinterpret_cast<decltype(node_attribute)>(get("cuGraphKernelNodeGetAttribute"));
    func_attribute = reinterpret_cast<decltype(func_attribute)>(get("cuFuncGetAttribute"));
  }
};

Driver& driver() {
  static Driver d;
  return d;
}

void check(CUresult status, const char* what) {
  if (status != 0) throw std::runtime_error(std::string(what) + " failed: CUresult " + std::to_string(status));
}

// Where a replayed parameter's value comes from: the call's tensors' data pointers, or its eps.
enum Source : int { X = 0, W = 1, B = 2, Y = 3, MEAN = 4, RSTD = 5, EPS = 6 };

struct Launch {
  CUfunction func;
  unsigned grid[3], block[3], smem;
  std::vector<unsigned char> params;  // every parameter's bytes at its offset, as recorded
  std::vector<size_t> offsets;
  std::vector<std::pair<size_t, int>> subs;  // (byte offset, Source)
  std::vector<void*> args;  // pointers into params, one per parameter
};

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
  PlanTable(py::object outputs_cls, bool want_mean, bool want_rstd, double default_eps, py::object tensor_type,
            py::object hooks, size_t limit)
      : outputs_cls_(std::move(outputs_cls)), want_mean_(want_mean), want_rstd_(want_rstd),
        default_eps_(default_eps), tensor_type_(std::move(tensor_type)), hooks_(std::move(hooks)), limit_(limit) {
    py::module_ c = py::module_::import("torch._C");
    raw_stream_ = c.attr("_cuda_getCurrentRawStream");
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
      check(driver().launch(l.func, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.smem,
                            stream, l.args.data(), nullptr),
            "cuLaunchKernel");
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

  // A plan for the signature of (x, w, b): launches as read_graph returned them, with each
  // parameter's source (-1: the recorded bytes) in ``sources`` per launch.
  void add(py::handle x, py::handle w, py::handle b, int64_t device, py::list launches, py::list keep) {
    std::vector<int64_t> key;
    add_tensor_key(key, x.ptr());
    add_tensor_key(key, w.ptr());
    add_tensor_key(key, b.ptr());
    if (plans_.size() >= limit_) plans_.clear();  // a full table is cleared rather than searched
    Plan plan;
    check(driver().ctx_current(&plan.ctx), "cuCtxGetCurrent");
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
      plan.launches.push_back(std::move(l));
    }
    for (Launch& l : plan.launches)  // after the moves: pointers into each launch's own bytes
      for (size_t off : l.offsets) l.args.push_back(l.params.data() + off);
    for (py::handle k : keep) plan.keep.push_back(py::reinterpret_borrow<py::object>(k));
    plans_[key] = std::move(plan);
  }

  size_t size() const { return plans_.size(); }
  void clear() { plans_.clear(); }

 private:
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
  std::unordered_map<std::vector<int64_t>, Plan, KeyHash> plans_;
  std::vector<int64_t> key_;
};

// The kernel launches of a captured graph, in stream order: (function, grid, block, shared
// bytes, parameter bytes, parameter offsets, parameter sizes). Raises on any other kind of node
// or on a launch whose parameters cannot be read one by one.
py::list read_graph(uintptr_t graph_handle) {
  Driver& d = driver();
  if (!d.error.empty()) throw std::runtime_error(d.error);
  CUgraph graph = reinterpret_cast<CUgraph>(graph_handle);
  size_t count = 0;
  check(d.graph_nodes(graph, nullptr, &count), "cuGraphGetNodes");
  std::vector<CUgraphNode> nodes(count);
  check(d.graph_nodes(graph, nodes.data(), &count), "cuGraphGetNodes");
  size_t edges = 0;
  check(d.graph_edges(graph, nullptr, nullptr, &edges), "cuGraphGetEdges");
  std::vector<CUgraphNode> from(edges), to(edges);
  if (edges) check(d.graph_edges(graph, from.data(), to.data(), &edges), "cuGraphGetEdges");
  // One stream's capture is a chain: order the nodes by following it from the node nothing precedes.
  std::unordered_map<CUgraphNode, CUgraphNode> next;
  std::unordered_map<CUgraphNode, int> incoming;
  for (size_t i = 0; i < edges; ++i) {
    if (next.count(from[i])) throw std::runtime_error("the captured launches are not one chain");
    next[from[i]] = to[i];
    incoming[to[i]] += 1;
  }
  std::vector<CUgraphNode> order;
  for (CUgraphNode n : nodes)
    if (!incoming.count(n)) order.push_back(n);
  if (count && order.size() != 1) throw std::runtime_error("the captured launches are not one chain");
  while (count && order.size() < count) {
    auto it = next.find(order.back());
    if (it == next.end()) throw std::runtime_error("the captured launches are not one chain");
    order.push_back(it->second);
  }
  py::list out;
  for (CUgraphNode n : order) {
    int type = -1;
    check(d.node_type(n, &type), "cuGraphNodeGetType");
    if (type != kNodeKernel) throw std::runtime_error("the capture holds a node other than a kernel launch (type " +
                                                      std::to_string(type) + ")");
    KernelNodeParams p{};
    check(d.kernel_params(n, &p), "cuGraphKernelNodeGetParams");
    if (!p.func) throw std::runtime_error("a captured launch names no CUfunction");
    if (!p.kernelParams) throw std::runtime_error("a captured launch passes its parameters packed (extra), not one by one");
    // cuLaunchKernel takes no launch attributes: a cluster or cooperative launch replayed
    // without them faults (an illegal instruction) or deadlocks, so one found here is refused.
    // On the H200's driver (580) reading a captured node's attributes failed, so a failed read
    // proves nothing either way: kernels that launch clusters also say so themselves
    // (NormKernel.native_replay), and the caller refuses them before any capture.
    for (int attr : {kAttrClusterDim, kAttrPreferredCluster}) {
      LaunchAttributeValue v{};
      if (d.node_attribute(n, attr, &v) == 0 &&
          static_cast<unsigned long long>(std::max(v.clusterDim.x, 1u)) * std::max(v.clusterDim.y, 1u) *
                  std::max(v.clusterDim.z, 1u) > 1)
        throw std::runtime_error("a cluster launch (" + std::to_string(v.clusterDim.x) + "x" +
                                 std::to_string(v.clusterDim.y) + "x" + std::to_string(v.clusterDim.z) +
                                 " blocks): cuLaunchKernel would drop its cluster shape");
    }
    LaunchAttributeValue coop{};
    if (d.node_attribute(n, kAttrCooperative, &coop) == 0 && coop.cooperative)
      throw std::runtime_error("a cooperative launch: cuLaunchKernel would drop it");
    int must_set = 0;
    if (d.func_attribute(&must_set, kFuncClusterMustBeSet, p.func) == 0 && must_set)
      throw std::runtime_error("a kernel that must be launched with a cluster size");
    std::vector<size_t> offsets, sizes;
    size_t end = 0;
    for (size_t i = 0;; ++i) {
      size_t offset = 0, size = 0;
      if (d.param_info(p.func, i, &offset, &size) != 0) break;
      offsets.push_back(offset);
      sizes.push_back(size);
      end = std::max(end, offset + size);
    }
    std::string bytes(end, '\0');
    for (size_t i = 0; i < offsets.size(); ++i) std::memcpy(&bytes[offsets[i]], p.kernelParams[i], sizes[i]);
    out.append(py::make_tuple(reinterpret_cast<uintptr_t>(p.func),
                              py::make_tuple(p.gridDimX, p.gridDimY, p.gridDimZ),
                              py::make_tuple(p.blockDimX, p.blockDimY, p.blockDimZ), p.sharedMemBytes,
                              py::bytes(bytes), offsets, sizes));
  }
  return out;
}

// Whether ``address`` is memory the driver knows (a device or managed allocation).
bool is_device_pointer(uintptr_t address) {
  Driver& d = driver();
  if (!d.error.empty() || address == 0) return false;
  unsigned int memory_type = 0;
  return d.pointer_attribute(&memory_type, kPointerMemoryType, address) == 0;
}

std::string driver_error() { return driver().error; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<PlanTable>(m, "PlanTable")
      .def(py::init<py::object, bool, bool, double, py::object, py::object, size_t>())
      .def("__call__", &PlanTable::call)
      .def("add", &PlanTable::add)
      .def("__len__", &PlanTable::size)
      .def("clear", &PlanTable::clear);
  m.def("read_graph", &read_graph);
  m.def("is_device_pointer", &is_device_pointer);
  m.def("driver_error", &driver_error);
}
