#include "parallel/process_group.h"

#include <torch/torch.h>

#include "device/device.h"
#include "diffuse/errors.h"
#include "parallel/c10d_compat.h"

namespace diffuse::parallel {
namespace {

std::string seconds(std::chrono::milliseconds ms) {
  return std::to_string(ms.count() / 1000) + " s";
}

compat::BackendPtr make_backend(const std::string& name,
                                const c10::intrusive_ptr<c10d::Store>& store,
                                const GroupOptions& o) {
#ifdef DIFFUSE_HAVE_GLOO
  if (name == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(o.timeout);
    // Loopback only: the ranks are processes on this machine, and nothing else may join.
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.world, opts);
  }
#endif
#ifdef DIFFUSE_HAVE_NCCL
  if (name == "nccl") {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = o.timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, o.rank, o.world, opts);
  }
#endif
#ifdef DIFFUSE_HAVE_HCCL
  if (name == "hccl") {
    auto opts = c10d_npu::ProcessGroupHCCL::Options::create();
    opts->timeout = o.timeout;
    return c10::make_intrusive<c10d_npu::ProcessGroupHCCL>(store, o.rank, o.world, opts);
  }
#endif
  (void)store;
  (void)o;
  throw DeviceError("CFG-parallel: the " + name + " backend is not in this build");
}

class ProcessGroupCfg : public CfgGroup {
 public:
  ProcessGroupCfg(compat::BackendPtr backend, c10::intrusive_ptr<c10d::Store> store,
                  std::string name, const GroupOptions& o)
      : backend_(std::move(backend)),
        store_(std::move(store)),
        name_(std::move(name)),
        options_(o) {}

  int rank() const override { return options_.rank; }
  int size() const override { return options_.world; }
  std::string describe() const override {
    return name_ + ", rank " + std::to_string(options_.rank) + " of " +
           std::to_string(options_.world);
  }

  std::vector<torch::Tensor> all_gather(const torch::Tensor& mine) override {
    // The backend writes the buffers from its own threads, which are not in the caller's
    // InferenceMode: they must be normal tensors, not inference tensors.
    c10::InferenceMode normal_tensors(false);
    std::vector<at::Tensor> in{mine.clone(at::MemoryFormat::Contiguous)};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < options_.world; ++r) out[0].push_back(torch::empty_like(in[0]));
    // Each rank marks its arrival at this exchange in the store, so that a timeout can name
    // the ranks that never came (the collective itself cannot tell).
    ++exchanges_;
    try {
      store_->set(arrival_key(exchanges_, options_.rank), std::vector<uint8_t>{'1'});
    } catch (const std::exception&) {
      // Only the report on a failure needs it.
    }
    try {
      c10d::AllgatherOptions opts;
      opts.timeout = options_.timeout;
      auto work = backend_->allgather(out, in, opts);
      work->wait(options_.timeout);
    } catch (const std::exception& e) {
      // c10::Error's what() carries a C++ backtrace; the first line is the message.
      std::string what = e.what();
      what = what.substr(0, what.find('\n'));
      throw Error("CFG-parallel (" + describe() +
                  "): exchanging noise predictions failed: " + what + " (" + missing_ranks() + ")");
    }
    return out[0];
  }

 private:
  static std::string arrival_key(int64_t exchange, int rank) {
    return "diffuse/exchange/" + std::to_string(exchange) + "/" + std::to_string(rank);
  }

  // Which peers never reached the current exchange, for the failure report.
  std::string missing_ranks() const {
    std::string missing;
    try {
      for (int r = 0; r < options_.world; ++r)
        if (r != options_.rank && !store_->check({arrival_key(exchanges_, r)}))
          missing += (missing.empty() ? "rank " : ", rank ") + std::to_string(r);
    } catch (const std::exception&) {
      missing.clear();
    }
    const std::string within = " within " + seconds(options_.timeout);
    if (missing.empty()) return "a peer process died, or gave no answer" + within;
    return missing + " never reached exchange " + std::to_string(exchanges_) +
           " (died, or stuck for longer than" + within + ")";
  }

  compat::BackendPtr backend_;
  c10::intrusive_ptr<c10d::Store> store_;
  int64_t exchanges_ = 0;
  std::string name_;
  GroupOptions options_;
};

}  // namespace

std::string backend_for(const torch::Device& device) {
  switch (device.type()) {
    case c10::DeviceType::CPU:
#ifdef DIFFUSE_HAVE_GLOO
      return "gloo";
#else
      throw DeviceError(
          "CFG-parallel on cpu needs Gloo, which this build lacks (install Gloo's "
          "headers, e.g. Debian's libgloo-dev, and rebuild)");
#endif
    case c10::DeviceType::CUDA:
#ifdef DIFFUSE_HAVE_NCCL
      return "nccl";
#else
      throw DeviceError(
          "CFG-parallel on cuda needs NCCL, which this build lacks (a CUDA "
          "libtorch with NCCL's headers)");
#endif
    case c10::DeviceType::PrivateUse1:
#ifdef DIFFUSE_HAVE_HCCL
      return "hccl";
#else
      throw DeviceError(
          "CFG-parallel on npu needs torch_npu's HCCL process group, which this "
          "build lacks (-DDIFFUSE_WITH_TORCH_NPU=ON)");
#endif
    default:
      throw DeviceError("CFG-parallel: no collective backend for device " +
                        device::device_name(device));
  }
}

std::shared_ptr<CfgGroup> connect_group(const GroupOptions& o) {
  if (o.world < 2 || o.rank < 0 || o.rank >= o.world)
    throw InvalidArgument("CFG-parallel: rank " + std::to_string(o.rank) + " of " +
                          std::to_string(o.world) + " is not a valid place in a group");
  const std::string name = backend_for(o.device);
  const std::string where =
      "CFG-parallel rank " + std::to_string(o.rank) + " (store " + o.store_file + ")";
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::FileStore>(o.store_file, o.world);
    store->setTimeout(o.startup_timeout);
    // Every rank has loaded its model once the count reaches world; the last one to arrive
    // says so. Waiting here (with the long startup timeout) keeps model loading out of the
    // backend's per-collective timeout.
    if (store->add("diffuse/loaded", 1) == o.world)
      store->set("diffuse/all_loaded", std::vector<uint8_t>{'1'});
    store->wait({"diffuse/all_loaded"}, o.startup_timeout);
    store->setTimeout(o.timeout);
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw Error(where + ": the other ranks did not all arrive within " +
                seconds(o.startup_timeout) + ": " + what.substr(0, what.find('\n')));
  }
  try {
    return std::make_shared<ProcessGroupCfg>(make_backend(name, store, o), store, name, o);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw Error(where + ": starting " + name + " failed: " + what.substr(0, what.find('\n')));
  }
}

}  // namespace diffuse::parallel
