# Daemon <-> daemon control protocol (rendezvous, job and variable agreement, failures).
# Each message on the TCP control connection is a little-endian uint32 byte length
# followed by one Envelope in capnp's flat-array serialization. Bulk data never travels
# here: it goes over libfabric, tagged (see collective_transport.h).
@0xd7c5a1e4b3f29a61;

struct Envelope {
  protocolVersion @0 :UInt32;   # kClusterProtocolVersion; others are refused
  epoch @1 :UInt64;             # the sender's cluster epoch: 0 before it first formed, 1 once
                                # formed, +1 each time it re-forms (a lost node rejoined, a
                                # restarted coordinator); an AddressTable of a higher epoch
                                # than a formed node's re-forms it
  cluster @2 :Text;
  body :union {
    join @3 :Join;
    reject @4 :Reject;
    addressTable @5 :AddressTable;
    jobJoin @6 :JobJoin;
    jobWorld @7 :JobWorld;
    registerVar @8 :RegisterVar;
    varReady @9 :VarReady;
    varMismatch @10 :VarMismatch;
    nodeLost @11 :NodeLost;
    jobBroken @12 :JobBroken;
    heartbeat @13 :Heartbeat;
    jobLeft @14 :JobLeft;
    jobEnd @15 :JobEnd;
    challenge @16 :Challenge;
    authProof @17 :AuthProof;
    deviceRouteReport @18 :DeviceRouteReport;
    deviceRoute @19 :DeviceRoute;
    ncclReady @20 :NcclReady;
    ncclTurn @21 :NcclTurn;
  }
}

# node -> coordinator, first message on the connection.
struct Join {
  nodeIndex @0 :UInt32;
  nodeCount @1 :UInt32;
  fabricAddress @2 :Data;       # fi_getname of the node's endpoint
  fabricProvider @3 :Text;
  host @4 :Text;                # for messages only
  nonce @5 :Data;               # with a cluster secret: the node's nonce (cluster_auth.h)
  auth @6 :Data;                # with a cluster secret: HMAC over the coordinator's nonce
}

# coordinator -> node, first on an accepted connection when the cluster has a secret: the
# nonce the node's Join must authenticate (cluster_auth.h).
struct Challenge {
  nonce @0 :Data;
}

# coordinator -> node, right after accepting its Join when the cluster has a secret: proof
# that the coordinator holds the secret too (HMAC over the node's nonce).
struct AuthProof {
  auth @0 :Data;
}

# coordinator -> node: this node may not join (a malformed Join, another cluster, or, once
# the cluster has formed, any Join: a taken or lost index, another node count), or, before
# the cluster formed, a configuration conflict that stops every node. The node exits with
# this reason; a refused newcomer alone does not disturb a formed cluster.
struct Reject {
  reason @0 :Text;
}

# coordinator -> every node once all joined: fabric addresses by node index.
struct AddressTable {
  fabricAddresses @0 :List(Data);
  hosts @1 :List(Text);
  # The epoch's nodes (node indices, ascending): entry i of the lists above is rank i's.
  # Empty: every node 0..n-1 (a static cluster's epochs always hold every node; with
  # membership on etcd an epoch may hold only the survivors of a lost node).
  nodes @2 :List(UInt32);
}

# node -> coordinator: all local workers of a job connected here.
struct JobJoin {
  job @0 :Text;
  localSize @1 :UInt32;
  nodeIndex @2 :UInt32;
  nccl @3 :Bool;                # this daemon can run NCCL (built with it, a GPU, allowed)
}

# coordinator -> every node once every node joined the job: local sizes by node.
struct JobWorld {
  job @0 :Text;
  localSizes @1 :List(UInt32);
  barrierId @2 :UInt32;         # the job barrier's id in bulk-message tags
  deviceRoutes @3 :Bool;        # every node can run NCCL: device allreduces agree on their
                                # route across nodes (DeviceRouteReport); else the host ring
}

# node -> coordinator: a variable's fingerprint as registered on this node.
struct RegisterVar {
  job @0 :Text;
  name @1 :Text;
  dtype @2 :UInt32;
  count @3 :UInt64;
  op @4 :UInt32;
  nodeIndex @5 :UInt32;
  sparse @6 :Bool;              # a sparse variable: count is its rows
  dim @7 :UInt64;               # sparse: values per row
  options @8 :Text;             # sparse: its options, canonical form (compared as text)
}

# coordinator -> every node: all nodes agree; bulk messages of the variable use globalId.
struct VarReady {
  job @0 :Text;
  name @1 :Text;
  globalId @2 :UInt32;
}

# coordinator -> every node: the nodes disagree (message names them and their shapes).
struct VarMismatch {
  job @0 :Text;
  name @1 :Text;
  message @2 :Text;
}

# coordinator -> every node: a node's daemon is gone; the epoch is over.
struct NodeLost {
  nodeIndex @0 :UInt32;
  reason @1 :Text;
}

# node -> coordinator -> every other node: a started job lost a worker on that node (its
# process died, was killed or broke the control protocol); no step of the job can complete
# any more, so every node fails the job's operations.
struct JobBroken {
  job @0 :Text;
  barrierId @1 :UInt32;         # tells this run of the job from a later one of the same name
  nodeIndex @2 :UInt32;
  reason @3 :Text;
  clean @4 :Bool;               # a worker left with px_disconnect (not a failure: logged as
                                # news, and the job's remaining operations fail at once)
}

# node -> coordinator: every local worker of a started job has left this node. The node
# keeps the job's shards and posted receives (other nodes' workers may still use them)
# until every node said so.
struct JobLeft {
  job @0 :Text;
  barrierId @1 :UInt32;         # the run (a job name is reused by later runs)
  nodeIndex @2 :UInt32;
}

# coordinator -> every node: every node's workers of this run have left: free its shards,
# posted receives and agreement state.
struct JobEnd {
  job @0 :Text;
  barrierId @1 :UInt32;
}

# Both ways on every joined control connection, every peer_silence_ms / 4, sent by the
# event loop's timer: proof that the sending daemon runs, not only its kernel (which keeps
# answering TCP, keep-alive probes included, for a process that is stopped or hung). A
# peer from which nothing at all (heartbeat or other message) arrived for peer_silence_ms
# is lost.
struct Heartbeat {
  nodeIndex @0 :UInt32;         # the sender's
}

# node -> coordinator, in a job with device routes: this node's part of a dense variable's
# first cross-node allreduce (daemon/cluster/device_routes.h).
struct DeviceRouteReport {
  barrierId @0 :UInt32;         # the job's run
  globalId @1 :UInt32;          # the variable
  nodeIndex @2 :UInt32;
  device @3 :Bool;              # in device memory (else host memory)
  machine @4 :Text;             # host name and boot id: daemons of one machine share GPUs
  pciBusId @5 :Text;            # the GPU holding the node's sum
  nccl @6 :Text;                # NCCL's version on the node; "" without
}

# coordinator -> every node once every node reported: the variable's route for the run.
struct DeviceRoute {
  barrierId @0 :UInt32;
  globalId @1 :UInt32;
  nccl @2 :Bool;                # over NCCL; else the host ring through pinned memory
  comm @3 :UInt32;              # NCCL: the run's communicator, from 1
  uniqueId @4 :Data;            # NCCL, a new communicator: its ncclUniqueId (128 bytes)
  reason @5 :Text;              # the host ring: why not NCCL
}

# node -> coordinator: this node's part of a step of an NCCL variable is ready.
struct NcclReady {
  barrierId @0 :UInt32;
  globalId @1 :UInt32;
  step @2 :UInt64;
  nodeIndex @3 :UInt32;
}

# coordinator -> every node once every node's part is ready: the step's turn. Every node
# issues the run's NCCL steps in the order their turns arrive (the same on every node).
struct NcclTurn {
  barrierId @0 :UInt32;
  globalId @1 :UInt32;
  step @2 :UInt64;
  turn @3 :UInt64;              # 0, 1, 2, ... within the run
}
