// The CUDA driver as far as normdiff's native call path uses it: the types and enum values it
// reads, the entry points resolved at run time (dlopen, so no CUDA toolkit is needed to build),
// and the reading of a captured graph. Part of launch.cpp's translation unit: included there
// after the standard and torch headers, not compiled alone.
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

// Enum values and struct layouts as in cuda.h (checked against CUDA 13.0's by
// tests/test_native_pdl.py where a toolkit is installed).
constexpr int kNodeKernel = 0;          // CU_GRAPH_NODE_TYPE_KERNEL
constexpr int kAttrCooperative = 2;     // CU_LAUNCH_ATTRIBUTE_COOPERATIVE
constexpr int kAttrClusterDim = 4;      // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
constexpr int kAttrProgrammatic = 6;    // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
constexpr int kAttrPreferredCluster = 11;  // CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION
constexpr int kFuncClusterMustBeSet = 10;  // CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET
constexpr int kEdgeProgrammatic = 1;    // CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC

union LaunchAttributeValue {  // CUlaunchAttributeValue
  char pad[64];
  unsigned long long align;  // the real union holds pointers: 8-byte aligned
  int cooperative;
  struct {
    unsigned int x, y, z;
  } clusterDim;
  int programmaticStreamSerializationAllowed;
};

struct LaunchAttribute {  // CUlaunchAttribute
  int id;
  char pad[4];
  LaunchAttributeValue value;
};

struct LaunchConfig {  // CUlaunchConfig
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  LaunchAttribute* attrs;
  unsigned int numAttrs;
};

struct EdgeData {  // CUgraphEdgeData
  unsigned char from_port, to_port, type, reserved[5];
};

static_assert(sizeof(LaunchAttributeValue) == 64 && sizeof(LaunchAttribute) == 72 &&
                  offsetof(LaunchAttribute, value) == 8, "CUlaunchAttribute's layout");
static_assert(sizeof(LaunchConfig) == 56 && offsetof(LaunchConfig, hStream) == 32 &&
                  offsetof(LaunchConfig, attrs) == 40 && offsetof(LaunchConfig, numAttrs) == 48,
              "CUlaunchConfig's layout");
static_assert(sizeof(EdgeData) == 8, "CUgraphEdgeData's layout");
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
  // Optional: a driver without them still replays launches without PDL.
  CUresult (*launch_ex)(const LaunchConfig*, CUfunction, void**, void**) = nullptr;  // CUDA 11.8+
  CUresult (*graph_edges_v2)(CUgraph, CUgraphNode*, CUgraphNode*, EdgeData*, size_t*) = nullptr;  // 12.3+
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
    launch_ex = reinterpret_cast<decltype(launch_ex)>(dlsym(lib, "cuLaunchKernelEx"));
    graph_edges_v2 = reinterpret_cast<decltype(graph_edges_v2)>(dlsym(lib, "cuGraphGetEdges_v2"));
  }
};

Driver& driver() {
  static Driver d;
  return d;
}

void check(CUresult status, const char* what) {
  if (status != 0) throw std::runtime_error(std::string(what) + " failed: CUresult " + std::to_string(status));
}

// The kernel launches of a captured graph, in stream order, after its first ``lead`` nodes
// (kernels the caller launched before the recorded ones, so that their first launch has an
// incoming edge): (function, grid, block, shared bytes, parameter bytes, parameter offsets,
// parameter sizes, pdl edge, pdl attribute). Raises on any other kind of node or on a launch
// whose parameters cannot be read one by one.
//
// What the capture says about PDL, per launch (impls.native decides what follows from it): a
// capture turns a PDL launch into a programmatic edge from the node before it, so ``pdl edge``
// is 1 for such an edge, 0 for an ordinary one, -1 where there is no edge into the node or the
// driver gives no edge data (no cuGraphGetEdges_v2); ``pdl attribute`` is the node's
// programmatic-serialization attribute, -1 where the driver does not answer (cuda.h calls it an
// attribute of launches, not of graph nodes).
py::list read_graph(uintptr_t graph_handle, size_t lead) {
  Driver& d = driver();
  if (!d.error.empty()) throw std::runtime_error(d.error);
  CUgraph graph = reinterpret_cast<CUgraph>(graph_handle);
  size_t count = 0;
  check(d.graph_nodes(graph, nullptr, &count), "cuGraphGetNodes");
  std::vector<CUgraphNode> nodes(count);
  check(d.graph_nodes(graph, nodes.data(), &count), "cuGraphGetNodes");
  size_t edges = 0;
  std::vector<CUgraphNode> from, to;
  std::vector<EdgeData> data;
  if (d.graph_edges_v2) {
    check(d.graph_edges_v2(graph, nullptr, nullptr, nullptr, &edges), "cuGraphGetEdges_v2");
    from.resize(edges), to.resize(edges), data.resize(edges);
    if (edges) check(d.graph_edges_v2(graph, from.data(), to.data(), data.data(), &edges), "cuGraphGetEdges_v2");
  } else {
    // Without edge data: a graph holding a programmatic edge answers CUDA_ERROR_LOSSY_QUERY (402).
    check(d.graph_edges(graph, nullptr, nullptr, &edges), "cuGraphGetEdges");
    from.resize(edges), to.resize(edges);
    if (edges) check(d.graph_edges(graph, from.data(), to.data(), &edges), "cuGraphGetEdges");
  }
  // One stream's capture is a chain: order the nodes by following it from the node nothing precedes.
  std::unordered_map<CUgraphNode, CUgraphNode> next;
  std::unordered_map<CUgraphNode, int> incoming;
  std::unordered_map<CUgraphNode, int> edge_type;  // of the edge into a node, where known
  for (size_t i = 0; i < edges; ++i) {
    if (next.count(from[i])) throw std::runtime_error("the captured launches are not one chain");
    next[from[i]] = to[i];
    incoming[to[i]] += 1;
    if (!data.empty()) edge_type[to[i]] = data[i].type == kEdgeProgrammatic ? 1 : 0;
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
  for (size_t i = 0; i < std::min(lead, order.size()); ++i) {
    int type = -1;
    check(d.node_type(order[i], &type), "cuGraphNodeGetType");
    if (type != kNodeKernel) throw std::runtime_error("the capture's lead node is not a kernel launch");
  }
  order.erase(order.begin(), order.begin() + std::min(lead, order.size()));
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
    // A replay carries no launch attribute but PDL's: a cluster or cooperative launch replayed
    // without its attributes faults (an illegal instruction) or deadlocks, so one found here is refused.
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
    auto edge = edge_type.find(n);
    LaunchAttributeValue programmatic{};
    int attribute = d.node_attribute(n, kAttrProgrammatic, &programmatic) == 0
                        ? (programmatic.programmaticStreamSerializationAllowed != 0) : -1;
    out.append(py::make_tuple(reinterpret_cast<uintptr_t>(p.func),
                              py::make_tuple(p.gridDimX, p.gridDimY, p.gridDimZ),
                              py::make_tuple(p.blockDimX, p.blockDimY, p.blockDimZ), p.sharedMemBytes,
                              py::bytes(bytes), offsets, sizes, edge == edge_type.end() ? -1 : edge->second,
                              attribute));
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

// Whether the driver can replay a launch with PDL (cuLaunchKernelEx) and report a capture's edge
// data (cuGraphGetEdges_v2).
py::dict driver_features() {
  Driver& d = driver();
  py::dict out;
  out["launch_ex"] = d.launch_ex != nullptr;
  out["edge_data"] = d.graph_edges_v2 != nullptr;
  return out;
}

}  // namespace
