#include "parallel/process_group.h"

#include <torch/torch.h>

#include <cstdlib>
#include <functional>
#include <sstream>

#include "device/device.h"
#include "diffuse/errors.h"
#include "parallel/c10d_compat.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace diffuse::parallel {
namespace {

std::string seconds(std::chrono::milliseconds ms) {
  return std::to_string(ms.count() / 1000) + " s";
}

// c10::Error's what() carries a C++ backtrace; the first line is the message.
std::string first_line(const std::exception& e) {
  const std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

bool is_loopback(const std::string& host) {
  return host.empty() || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

#ifdef DIFFUSE_HAVE_GLOO
// The interface Gloo's sockets use: loopback for ranks on this machine, so that nothing else
// may join; $GLOO_SOCKET_IFNAME (torch's convention) or the host name's address across hosts.
std::shared_ptr<::gloo::transport::Device> gloo_device(const GroupOptions& o) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (is_loopback(o.master_addr))
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}
#endif

compat::BackendPtr make_backend(const std::string& name,
                                const c10::intrusive_ptr<c10d::Store>& store,
                                const GroupOptions& o) {
#ifdef DIFFUSE_HAVE_GLOO
  if (name == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(o.timeout);
    opts->devices.push_back(gloo_device(o));
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
  throw DeviceError(o.purpose + ": the " + name + " backend is not in this build");
}

// A contiguous copy of `t`'s bytes, flat: what the backend sends.
torch::Tensor bytes_copy(const torch::Tensor& t) {
  return t.clone(at::MemoryFormat::Contiguous).view({-1}).view(torch::kUInt8);
}

class ProcessGroupRanks : public RankGroup {
 public:
  ProcessGroupRanks(compat::BackendPtr backend, c10::intrusive_ptr<c10d::Store> store,
                    std::string name, const GroupOptions& o)
      : backend_(std::move(backend)),
        store_(std::move(store)),
        name_(std::move(name)),
        options_(o) {}

  int rank() const override { return options_.rank; }
  int size() const override { return options_.world; }
  int64_t bytes_sent() const override { return bytes_sent_; }
  torch::Device device() const override { return options_.device; }
  std::string describe() const override {
    return name_ + ", rank " + std::to_string(options_.rank) + " of " +
           std::to_string(options_.world);
  }

  std::vector<torch::Tensor> all_gather(const torch::Tensor& mine,
                                        const std::string& what) override {
    // The backend writes the buffers from its own threads, which are not in the caller's
    // InferenceMode: they must be normal tensors, not inference tensors. Bytes, whatever the
    // dtype: Gloo lacks some (bfloat16 in libtorch 1.13), and the data only moves.
    c10::InferenceMode normal_tensors(false);
    std::vector<at::Tensor> in{bytes_copy(mine)};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < options_.world; ++r) out[0].push_back(torch::empty_like(in[0]));
    bytes_sent_ += in[0].numel() * (options_.world - 1);
    run(what, [&] {
      c10d::AllgatherOptions opts;
      opts.timeout = options_.timeout;
      return backend_->allgather(out, in, opts);
    });
    std::vector<torch::Tensor> parts;
    for (auto& t : out[0]) parts.push_back(t.view(mine.scalar_type()).view(mine.sizes()));
    return parts;
  }

  torch::Tensor all_to_all(const torch::Tensor& send, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& recv_counts,
                           const std::string& what) override {
    const auto world = static_cast<size_t>(options_.world);
    int64_t sent = 0, received = 0;
    for (auto c : send_counts) sent += c;
    for (auto c : recv_counts) received += c;
    if (send.dim() != 1 || send_counts.size() != world || recv_counts.size() != world ||
        sent != send.numel())
      throw InvalidArgument(options_.purpose + " (" + describe() + "): all_to_all of " + what +
                            " needs a 1-d tensor of the send counts' total and " +
                            std::to_string(world) + " counts each way");
    // Bytes, as all_gather.
    const int64_t esize = static_cast<int64_t>(send.element_size());
    std::vector<int64_t> send_bytes, recv_bytes;
    for (auto c : send_counts) send_bytes.push_back(c * esize);
    for (auto c : recv_counts) recv_bytes.push_back(c * esize);
    c10::InferenceMode normal_tensors(false);
    auto in = bytes_copy(send);
    auto out = torch::empty({received * esize}, in.options());
    bytes_sent_ += (sent - send_counts[static_cast<size_t>(options_.rank)]) * esize;
    run(what, [&] {
      c10d::AllToAllOptions opts;
      opts.timeout = options_.timeout;
      return backend_->alltoall_base(out, in, recv_bytes, send_bytes, opts);
    });
    return out.view(send.scalar_type());
  }

  void post(const std::string& key, const std::string& value) override {
    try {
      store_->set(post_key(key), std::vector<uint8_t>(value.begin(), value.end()));
    } catch (const std::exception& e) {
      throw Error(options_.purpose + " (" + describe() + "): posting " + key +
                  " failed: " + first_line(e));
    }
  }

  std::string wait_post(const std::string& key, std::chrono::milliseconds timeout) override {
    const std::string k = post_key(key);
    try {
      store_->wait({k}, timeout.count() > 0 ? timeout : c10d::Store::kNoTimeout);
      const auto v = store_->get(k);
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      throw Error(options_.purpose + " (" + describe() + "): waiting for " + key +
                  " failed (the rank serving the store is gone, or " +
                  (timeout.count() > 0 ? "it did not come within " + seconds(timeout)
                                       : std::string("the store failed")) +
                  "): " + first_line(e));
    }
  }

  int64_t add_post(const std::string& key, int64_t delta) override {
    try {
      return store_->add(post_key(key), delta);
    } catch (const std::exception& e) {
      throw Error(options_.purpose + " (" + describe() + "): counting " + key +
                  " failed: " + first_line(e));
    }
  }

  void drop_post(const std::string& key) override {
    try {
      store_->deleteKey(post_key(key));
    } catch (const std::exception&) {
      // FileStore keeps its keys.
    }
  }

 private:
  static std::string post_key(const std::string& key) { return "diffuse/post/" + key; }

  // One collective: each rank marks its arrival at this exchange in the store, so that a
  // timeout can name the ranks that never came (the collective itself cannot tell).
  void run(const std::string& what, const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
    ++exchanges_;
    try {
      store_->set(arrival_key(exchanges_, options_.rank), std::vector<uint8_t>{'1'});
    } catch (const std::exception&) {
      // Only the report on a failure needs it.
    }
    try {
      start()->wait(options_.timeout);
    } catch (const std::exception& e) {
      throw Error(options_.purpose + " (" + describe() + "): exchanging " + what +
                  " failed: " + first_line(e) + " (" + missing_ranks() + ")");
    }
  }

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
  int64_t bytes_sent_ = 0;
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
          "a parallel run on cpu needs Gloo, which this build lacks (install Gloo's "
          "headers, e.g. Debian's libgloo-dev, and rebuild)");
#endif
    case c10::DeviceType::CUDA:
#ifdef DIFFUSE_HAVE_NCCL
      return "nccl";
#else
      throw DeviceError(
          "a parallel run on cuda needs NCCL, which this build lacks (a CUDA "
          "libtorch with NCCL's headers)");
#endif
    case c10::DeviceType::PrivateUse1:
#ifdef DIFFUSE_HAVE_HCCL
      return "hccl";
#else
      throw DeviceError(
          "a parallel run on npu needs torch_npu's HCCL process group, which this "
          "build lacks (-DDIFFUSE_WITH_TORCH_NPU=ON)");
#endif
    default:
      throw DeviceError("no collective backend for device " + device::device_name(device));
  }
}

namespace {

// A barrier on the store: each rank counts itself in under `key` and waits until all `world`
// have (the last one in raises the flag `key` + "/all"). Rank 0 may serve the store and leave
// right after (a refusal): it returns only once every rank has counted itself out too, so that
// no other rank is still waiting on a store that has gone ("Connection reset by peer").
void all_arrive(c10d::Store& store, const std::string& key, int world, int rank,
                std::chrono::milliseconds timeout) {
  const std::vector<uint8_t> one{'1'};
  if (store.add(key, 1) == world) store.set(key + "/all", one);
  store.wait({key + "/all"}, timeout);
  if (store.add(key + "/out", 1) == world) store.set(key + "/out/all", one);
  if (rank == 0) store.wait({key + "/out/all"}, timeout);
}

c10::intrusive_ptr<c10d::Store> open_store(const GroupOptions& o) {
  if (!o.store_file.empty()) return c10::make_intrusive<c10d::FileStore>(o.store_file, o.world);
  c10d::TCPStoreOptions t;
  t.port = static_cast<std::uint16_t>(o.master_port);
  // Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) its agent already serves the store.
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  t.isServer = o.rank == 0 && !(agent && std::string(agent) == "True");
  t.numWorkers = o.world;
  t.waitWorkers = false;  // the rendezvous below counts the ranks itself
  t.timeout = o.startup_timeout;
  return c10::make_intrusive<c10d::TCPStore>(o.master_addr, t);
}

// The backend over a store whose ranks have met (connect_world) or meet in its constructor.
std::shared_ptr<RankGroup> start_group(const c10::intrusive_ptr<c10d::Store>& store,
                                       const GroupOptions& o) {
  const std::string name = backend_for(o.device);
  try {
    auto group = std::make_shared<ProcessGroupRanks>(make_backend(name, store, o), store, name, o);
    // No rank goes on until every rank's backend has connected: one that finished early and
    // dropped its group would close its half of a pair another rank is still handshaking
    // ("Connection closed by peer" on rank 0).
    all_arrive(*store, "diffuse/started", o.world, o.rank, o.timeout);
    return group;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(o.purpose + " rank " + std::to_string(o.rank) + ": starting " + name +
                " failed: " + first_line(e));
  }
}

std::string store_name(const GroupOptions& o) {
  if (!o.store_file.empty()) return "store " + o.store_file;
  return "store " + o.master_addr + ":" + std::to_string(o.master_port);
}

std::string as_string(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

// The first line where two job descriptions differ, "seed=5 here, seed=6 on rank 1".
std::string first_difference(const std::string& mine, const std::string& theirs, int rank) {
  std::istringstream a(mine), b(theirs);
  std::string la, lb;
  while (true) {
    const bool ga = static_cast<bool>(std::getline(a, la));
    const bool gb = static_cast<bool>(std::getline(b, lb));
    if (!ga && !gb) return "";
    if (!ga) la = "(nothing)";
    if (!gb) lb = "(nothing)";
    if (la != lb) return la + " here, " + lb + " on rank " + std::to_string(rank);
  }
}

// The rendezvous: every rank publishes its job, counts itself in, and waits for the count to
// reach the group's size as rank 0 has it; then all compare their jobs. A rank that finds rank 0
// has another group size says so in the store before counting in, so that all fail at once,
// naming it, rather than at the timeout. Nobody leaves before everyone has read what it needs.
void meet(c10d::Store& store, const GroupOptions& o) {
  const std::string job = "world=" + std::to_string(o.world) + "\n" + o.job;
  store.set("diffuse/job/" + std::to_string(o.rank), std::vector<uint8_t>(job.begin(), job.end()));
  const std::string first_of_zero = as_string(store.get("diffuse/job/0"));
  const std::string zero_world = first_of_zero.substr(0, first_of_zero.find('\n'));
  const std::string my_world = "world=" + std::to_string(o.world);
  int group_size = o.world;  // rank 0's, which every rank's barriers count to
  if (zero_world != my_world) {
    const std::string why = "ranks disagree on the group's size: " + my_world + " on rank " +
                            std::to_string(o.rank) + ", " + zero_world + " on rank 0";
    store.set("diffuse/abort", std::vector<uint8_t>(why.begin(), why.end()));
    try {
      group_size = std::stoi(zero_world.substr(std::string("world=").size()));
    } catch (const std::exception&) {
      group_size = 0;
    }
    if (group_size < 1) throw InvalidArgument(why);  // not a diffuse rank 0: nothing to wait for
  }
  all_arrive(store, "diffuse/loaded", group_size, o.rank, o.startup_timeout);
  std::string refusal;
  if (store.check({"diffuse/abort"})) refusal = as_string(store.get("diffuse/abort"));
  for (int r = 0; r < o.world && refusal.empty(); ++r) {
    if (r == o.rank) continue;
    const auto diff =
        first_difference(job, as_string(store.get("diffuse/job/" + std::to_string(r))), r);
    if (!diff.empty())
      refusal = "rank " + std::to_string(o.rank) + " was not started for the same run as rank " +
                std::to_string(r) + ": " + diff;
  }
  // Everyone has read every job before anyone leaves: rank 0 may serve the store, and its exit
  // would cut the others off before they can say why.
  all_arrive(store, "diffuse/checked", group_size, o.rank, o.startup_timeout);
  if (!refusal.empty()) throw InvalidArgument(refusal);
}

struct Connected {
  std::shared_ptr<RankGroup> group;
  c10::intrusive_ptr<c10d::Store> store;
};

Connected connect_world(const GroupOptions& o) {
  if (o.world < 2 || o.rank < 0 || o.rank >= o.world)
    throw InvalidArgument(o.purpose + ": rank " + std::to_string(o.rank) + " of " +
                          std::to_string(o.world) + " is not a valid place in a group");
  if (o.store_file.empty() && (o.master_addr.empty() || o.master_port < 1 || o.master_port > 65535))
    throw InvalidArgument(o.purpose +
                          ": the ranks meet through a store file or at "
                          "MASTER_ADDR:MASTER_PORT (a port 1..65535), and neither was given");
  backend_for(o.device);  // refused before meeting when this build lacks it
  const std::string where =
      o.purpose + " rank " + std::to_string(o.rank) + " (" + store_name(o) + ")";
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = open_store(o);
  } catch (const std::exception& e) {
    throw Error(where + ": " +
                (o.rank == 0 && o.store_file.empty() ? "could not serve the store"
                                                     : "could not reach the store") +
                " within " + seconds(o.startup_timeout) + ": " + first_line(e));
  }
  try {
    store->setTimeout(o.startup_timeout);
    meet(*store, o);
    store->setTimeout(o.timeout);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(where + ": " + e.what());
  } catch (const std::exception& e) {
    throw Error(where + ": the other ranks did not all arrive within " +
                seconds(o.startup_timeout) + ": " + first_line(e));
  }
  return {start_group(store, o), store};
}

}  // namespace

std::shared_ptr<RankGroup> connect_group(const GroupOptions& o) {
  return connect_world(o).group;
}

ParallelGroups connect_groups(const GroupOptions& o, int cfg_ways) {
  if (cfg_ways < 1 || o.world % cfg_ways != 0)
    throw InvalidArgument(o.purpose + ": " + std::to_string(o.world) + " ranks do not split into " +
                          std::to_string(cfg_ways) + " guidance shares of equal size");
  auto world = connect_world(o);
  ParallelGroups g;
  g.world = world.group;
  const int n = o.world / cfg_ways, share = o.rank / n, token_share = o.rank % n;
  // Every rank makes its sub-groups in the same order (each one's members meet in its
  // constructor), under keys of their own in the same store.
  const auto sub = [&](const std::string& prefix, int rank, int size, const std::string& purpose) {
    GroupOptions so = o;
    so.rank = rank;
    so.world = size;
    so.purpose = purpose;
    return start_group(c10::make_intrusive<c10d::PrefixStore>(prefix, world.store), so);
  };
  // A split one way only is the world itself.
  if (n == 1) g.cfg = g.world;
  if (cfg_ways == 1) g.sequence = g.world;
  if (n > 1 && cfg_ways > 1) {
    g.sequence = sub("diffuse/ulysses/" + std::to_string(share) + "/", token_share, n, "Ulysses");
    g.cfg =
        sub("diffuse/cfg/" + std::to_string(token_share) + "/", share, cfg_ways, "CFG-parallel");
  }
  return g;
}

}  // namespace diffuse::parallel
