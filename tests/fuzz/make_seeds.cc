// Writes the fuzz targets' seed corpora, at build time, from the real encoders: control
// frames from finish_frame, envelopes from the cluster's own builder and frame_envelope,
// manifests and shard files from write_manifest / write_shard_file. Sparse request headers
// are laid out by sparse_wire.h's own size functions (SparseChannel::request builds them
// inline). Usage: px_fuzz_seeds OUT_DIR (OUT_DIR/<target>/<name> files; config seeds are
// committed text, tests/fuzz/seeds/config).
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/cluster/cluster_internal.h"
#include "fuzz_inputs.h"
#include "sharding/checkpoint.h"
#include "transport/fabric/cluster_wire.h"
#include "transport/fabric/sparse_wire.h"
#include "transport/ipc/control_channel.h"

namespace px::fuzz {
namespace {

std::string out_dir;

void write_seed(const std::string& target, const std::string& name, const std::string& bytes) {
  std::string dir = out_dir + "/" + target;
  ::mkdir(out_dir.c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
  std::string path = dir + "/" + name;
  FILE* f = fopen(path.c_str(), "wb");
  if (!f || fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || fclose(f) != 0) {
    fprintf(stderr, "px_fuzz_seeds: cannot write %s\n", path.c_str());
    exit(1);
  }
}

std::string read_file(const std::string& path) {
  std::string bytes;
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) {
    fprintf(stderr, "px_fuzz_seeds: cannot read %s\n", path.c_str());
    exit(1);
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) bytes.append(buf, n);
  fclose(f);
  return bytes;
}

// A stream seed: the split byte (cut in the middle), then the frames.
std::string stream(const std::string& frames) {
  return std::string(1, static_cast<char>(frames.size() / 2 % 256)) + frames;
}

void control_seeds() {
  using namespace px::control;
  auto seed = [](const std::string& name, auto fill) {
    flatbuffers::FlatBufferBuilder b;
    auto [type, body] = fill(b);
    write_seed("control", name, stream(finish_frame(b, type, body)));
  };
  std::string hello;
  {
    flatbuffers::FlatBufferBuilder b;
    auto body = CreateHello(b, 0x10003, b.CreateString("job-a"), -1, 2, 4242, 1 << 24);
    hello = finish_frame(b, Body::Hello, body.Union());
  }
  write_seed("control", "hello", stream(hello));
  seed("hello_reply", [](auto& b) {
    auto body = CreateHelloReply(b, 0, b.CreateString(""), 0x10003, 1, 2, 3, 4, 1, 2);
    return std::make_pair(Body::HelloReply, body.Union());
  });
  std::string dense;
  {
    flatbuffers::FlatBufferBuilder b;
    auto body = CreateRegisterDense(b, b.CreateString("weights"), 0, 1000, 0);
    dense = finish_frame(b, Body::RegisterDense, body.Union());
  }
  write_seed("control", "register_dense", stream(dense));
  seed("register_sparse", [](auto& b) {
    auto options = CreateSparseOptions(b, 2, 0.001, 0.9, 0.999, 1e-8, 0.1, 1, 7, -0.05, 0.05, 0.05,
                                       1, 2, 3, 8, 1, 1);
    auto body = CreateRegisterSparse(b, b.CreateString("embedding"), 0, 100000, 64, options);
    return std::make_pair(Body::RegisterSparse, body.Union());
  });
  seed("register_reply", [](auto& b) {
    auto body = CreateRegisterReply(b, 0, b.CreateString("ok"), 3);
    return std::make_pair(Body::RegisterReply, body.Union());
  });
  seed("stats_request", [](auto& b) {
    return std::make_pair(Body::StatsRequest, CreateStatsRequest(b, 3).Union());
  });
  seed("stats_reply", [](auto& b) {
    auto body =
        CreateStatsReply(b, 0, b.CreateString(""), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13);
    return std::make_pair(Body::StatsReply, body.Union());
  });
  seed("checkpoint", [](auto& b) {
    auto body = CreateCheckpoint(b, b.CreateString("/tmp/ckpt"), 30000);
    return std::make_pair(Body::Checkpoint, body.Union());
  });
  seed("checkpoint_reply", [](auto& b) {
    auto body = CreateCheckpointReply(b, 0, b.CreateString("written"));
    return std::make_pair(Body::CheckpointReply, body.Union());
  });
  std::string goodbye;
  {
    flatbuffers::FlatBufferBuilder b;
    goodbye = finish_frame(b, Body::Goodbye, CreateGoodbye(b).Union());
  }
  seed("error_text",
       [](auto& b) { return std::make_pair(Body::ErrorText, CreateErrorText(b, 77).Union()); });
  seed("error_text_reply", [](auto& b) {
    auto body = CreateErrorTextReply(b, true, b.CreateString("a long message"));
    return std::make_pair(Body::ErrorTextReply, body.Union());
  });
  seed("cancel", [](auto& b) {
    auto body = CreateCancel(b, 5, b.CreateString("barrier timed out"));
    return std::make_pair(Body::Cancel, body.Union());
  });
  seed("cancel_reply", [](auto& b) {
    return std::make_pair(Body::CancelReply, CreateCancelReply(b, true).Union());
  });
  seed("abort", [](auto& b) {
    auto body = CreateAbort(b, b.CreateString("diverged"));
    return std::make_pair(Body::Abort, body.Union());
  });
  seed("abort_reply", [](auto& b) {
    auto body = CreateAbortReply(b, 0, b.CreateString(""));
    return std::make_pair(Body::AbortReply, body.Union());
  });
  seed("register_device_memory", [](auto& b) {
    std::vector<uint8_t> handle(64, 0xab);
    auto body = CreateRegisterDeviceMemory(b, 1, b.CreateString("0000:19:00.0"),
                                           b.CreateVector(handle), 1 << 20);
    return std::make_pair(Body::RegisterDeviceMemory, body.Union());
  });
  seed("release_device_memory", [](auto& b) {
    return std::make_pair(Body::ReleaseDeviceMemory, CreateReleaseDeviceMemory(b, 1).Union());
  });
  seed("device_memory_reply", [](auto& b) {
    auto body = CreateDeviceMemoryReply(b, 12, b.CreateString("no usable GPU"));
    return std::make_pair(Body::DeviceMemoryReply, body.Union());
  });
  // A worker's session from hello to goodbye, as one stream.
  write_seed("control", "session", stream(hello + dense + goodbye));
}

void cluster_seeds() {
  using cluster_detail::build;
  using Fill = cluster_detail::Fill;
  std::string all;
  auto seed = [&all](const std::string& name, const std::string& cluster, const Fill& fill) {
    std::string frame = frame_envelope(*build(cluster, 1, fill));
    write_seed("cluster", name, stream(frame));
    all += frame;
  };
  std::string name = kClusterName;
  seed("join", name, [](Envelope::Body::Builder b) {
    auto j = b.initJoin();
    j.setNodeIndex(1);
    j.setNodeCount(kClusterNodes);
    const char address[] = "\x02\x00\x1f\x90\x7f\x00\x00\x01";
    j.setFabricAddress(kj::arrayPtr(reinterpret_cast<const kj::byte*>(address), 8));
    j.setFabricProvider("tcp;ofi_rxm");
    j.setHost("10.0.0.2:7070");
  });
  seed("reject", "another",
       [](Envelope::Body::Builder b) { b.initReject().setReason("node index 1 is taken"); });
  seed("address_table", name, [](Envelope::Body::Builder b) {
    auto t = b.initAddressTable();
    auto addresses = t.initFabricAddresses(kClusterNodes);
    auto hosts = t.initHosts(kClusterNodes);
    for (unsigned i = 0; i < static_cast<unsigned>(kClusterNodes); ++i) {
      std::string a = "addr" + std::to_string(i);
      addresses.set(i, kj::arrayPtr(reinterpret_cast<const kj::byte*>(a.data()), a.size()));
      hosts.set(i, "10.0.0." + std::to_string(i + 1) + ":7070");
    }
  });
  seed("job_join", name, [](Envelope::Body::Builder b) {
    auto j = b.initJobJoin();
    j.setJob("train");
    j.setLocalSize(2);
    j.setNodeIndex(2);
  });
  seed("job_world", name, [](Envelope::Body::Builder b) {
    auto w = b.initJobWorld();
    w.setJob("train");
    auto sizes = w.initLocalSizes(kClusterNodes);
    for (unsigned i = 0; i < static_cast<unsigned>(kClusterNodes); ++i) sizes.set(i, i + 1);
    w.setBarrierId(1);
  });
  seed("register_var", name, [](Envelope::Body::Builder b) {
    auto r = b.initRegisterVar();
    r.setJob("train");
    r.setName("embedding");
    r.setDtype(0);
    r.setCount(100000);
    r.setOp(0);
    r.setNodeIndex(3);
    r.setSparse(true);
    r.setDim(64);
    r.setOptions("adam(lr=0.001,b1=0.9,b2=0.999,eps=1e-08) init=zeros sum sync partitions=auto ps");
  });
  seed("var_ready", name, [](Envelope::Body::Builder b) {
    auto v = b.initVarReady();
    v.setJob("train");
    v.setName("embedding");
    v.setGlobalId(2);
  });
  seed("var_mismatch", name, [](Envelope::Body::Builder b) {
    auto v = b.initVarMismatch();
    v.setJob("train");
    v.setName("w");
    v.setMessage("variable 'w' differs across nodes");
  });
  seed("node_lost", name, [](Envelope::Body::Builder b) {
    auto l = b.initNodeLost();
    l.setNodeIndex(2);
    l.setReason("node 2 lost: connection closed");
  });
  seed("job_broken", name, [](Envelope::Body::Builder b) {
    auto j = b.initJobBroken();
    j.setJob("train");
    j.setBarrierId(1);
    j.setNodeIndex(1);
    j.setReason("worker 0 exited");
  });
  seed("heartbeat", name, [](Envelope::Body::Builder b) { b.initHeartbeat().setNodeIndex(3); });
  seed("device_route_report", name, [](Envelope::Body::Builder b) {
    auto r = b.initDeviceRouteReport();
    r.setBarrierId(1);
    r.setGlobalId(2);
    r.setNodeIndex(1);
    r.setDevice(true);
    r.setMachine("gpu-node-1/6f1c");
    r.setPciBusId("0000:19:00.0");
    r.setNccl("2.28.9");
  });
  seed("device_route", name, [](Envelope::Body::Builder b) {
    auto d = b.initDeviceRoute();
    d.setBarrierId(1);
    d.setGlobalId(2);
    d.setNccl(true);
    d.setComm(1);
    std::string id(kWireNcclIdBytes, 'i');
    d.setUniqueId(kj::arrayPtr(reinterpret_cast<const kj::byte*>(id.data()), id.size()));
  });
  seed("nccl_ready", name, [](Envelope::Body::Builder b) {
    auto r = b.initNcclReady();
    r.setBarrierId(1);
    r.setGlobalId(2);
    r.setStep(7);
    r.setNodeIndex(2);
  });
  seed("nccl_turn", name, [](Envelope::Body::Builder b) {
    auto t = b.initNcclTurn();
    t.setBarrierId(1);
    t.setGlobalId(2);
    t.setStep(7);
    t.setTurn(3);
  });
  write_seed("cluster", "all", stream(all));
  // What reaches the coordinator's verdicts: every node joins a job and registers a variable
  // (node 3 with another shape), then node 1 registers it again differently.
  std::string agreement;
  for (int node = 0; node < kClusterNodes; ++node)
    agreement += frame_envelope(*build(name, 1, [node](Envelope::Body::Builder b) {
      auto j = b.initJobJoin();
      j.setJob("train");
      j.setLocalSize(static_cast<uint32_t>(node + 1));
      j.setNodeIndex(static_cast<uint32_t>(node));
    }));
  for (int node : {0, 1, 2, 3, 1})
    agreement += frame_envelope(*build(name, 1, [node](Envelope::Body::Builder b) {
      auto r = b.initRegisterVar();
      r.setJob("train");
      r.setName("w");
      r.setCount(node == 3 ? 99 : 100);
      r.setNodeIndex(static_cast<uint32_t>(node));
    }));
  write_seed("cluster", "agreement", stream(agreement));
}

void sparse_seeds() {
  int n = 0;
  for (SparseOp op : {SparseOp::kPull, SparseOp::kPush, SparseOp::kLoad, SparseOp::kRead,
                      SparseOp::kCheckpoint}) {
    for (uint64_t dim : {2ull, 4ull, 64ull}) {
      // Rows of node 0's partitions 0 and 4 (of 8, 4 nodes), ascending, as a router sends.
      std::vector<int64_t> rows = {0, 4, 8, 12, 16, 20};
      SparseRequestHeader h{};
      h.op = static_cast<uint16_t>(op);
      h.from_node = 1;
      h.step = 0;
      h.count = rows.size();
      h.partition = op == SparseOp::kPull || op == SparseOp::kPush ? 0 : kAllPartitions;
      h.groups = 0;
      if (op == SparseOp::kPull && dim == 4) {  // one group of the two partitions
        h.groups = 1;
        h.partition = 0;
      }
      if (op == SparseOp::kPush && dim == 2) {  // partition 0 alone
        rows = {0, 8, 16};
        h.count = rows.size();
      }
      h.payload_bytes = sparse_payload_bytes(op, h.count, dim);
      std::string bytes(1, static_cast<char>(1 + 4 * (n % 9)));  // peer 1, knobs
      for (int i = 0; i < 8; ++i) bytes += static_cast<char>(((dim - 1) >> (8 * i)) & 0xff);
      bytes.append(reinterpret_cast<const char*>(&h), sizeof h);
      bytes.append(reinterpret_cast<const char*>(rows.data()), h.count * sizeof(int64_t));
      write_seed("sparse_header", std::string(sparse_op_name(op)) + "_dim" + std::to_string(dim),
                 bytes);
      ++n;
    }
  }
}

void checkpoint_seeds() {
  std::string error;
  ManifestData m;
  m.job = "train";
  m.variable = "embedding";
  m.options = "adagrad(lr=0.1,init_acc=0.1) init=zeros sum sync partitions=8 ps reject";
  m.rows = 1000;
  m.dim = 4;
  m.optimizer_steps = 12;
  m.state_slots = 1;
  m.nodes = 2;
  m.partitions = 8;
  m.shard_files = {"train.embedding.node0.shard", "train.embedding.node1.shard"};
  std::string manifest = out_dir + "/manifest.tmp";
  std::string shard = out_dir + "/shard.tmp";
  ShardFileData d;
  d.dim = 4;
  d.slots = 1;
  d.rows = {0, 2, 4};
  d.values.assign(d.rows.size() * d.dim, 0.5f);
  d.state.assign(d.rows.size() * d.slots * d.dim, 0.1f);
  if (!write_manifest(manifest, m, &error) || !write_shard_file(shard, d, &error)) {
    fprintf(stderr, "px_fuzz_seeds: %s\n", error.c_str());
    exit(1);
  }
  write_seed("checkpoint", "manifest",
             std::string(1, static_cast<char>(CheckpointFile::kManifest)) + read_file(manifest));
  write_seed("checkpoint", "shard",
             std::string(1, static_cast<char>(CheckpointFile::kShard)) + read_file(shard));
  ::unlink(manifest.c_str());
  ::unlink(shard.c_str());
}

}  // namespace
}  // namespace px::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: px_fuzz_seeds OUT_DIR\n");
    return 2;
  }
  px::fuzz::out_dir = argv[1];
  ::mkdir(argv[1], 0755);
  px::fuzz::control_seeds();
  px::fuzz::cluster_seeds();
  px::fuzz::sparse_seeds();
  px::fuzz::checkpoint_seeds();
  return 0;
}
