"""The config schema: one dataclass per config group, registered in Hydra's ConfigStore.

These dataclasses are the single place where every key, its type and its
default are defined (``docs/configuration.md`` is generated from them). The
YAML files in ``conf/`` only choose values: each group option names its
schema first in its defaults list (``defaults: [base_network, _self_]``), the
primary config starts from ``base_config``. Hydra then rejects unknown keys
and wrong types while composing; :mod:`controller.config.load` turns those
rejections and every semantic problem into one sentence each.

Values with units (durations, rates) are typed ``Any`` here because a user
may write ``0.001`` or ``"1ms"``; :mod:`controller.config.validate` parses
them. ``help`` in each field's metadata is the documentation of the key.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from agents.common.net import LOOPBACK
from agents.common.net import DEFAULT_MAX_MESSAGE_BYTES

__all__ = [
    "LOOPBACK", "Placement", "Optimizer", "Partition", "Discipline", "NetworkModel", "Collective",
    "ComputeModelName", "Distribution", "TcpConfig", "MicrobenchConfig", "FlatConfig",
    "Windows", "BatchMode", "TraceMode", "LogLevel", "PullPolicy", "StopConfig", "EvalConfig", "DataConfig",
    "ControllerConfig", "TLSConfig",
    "MetricsConfig", "TraceConfig", "StatelogConfig", "OutputsConfig", "PredictorConfig", "TopologyLinksConfig",
    "NetworkConfig", "ComputeConfig", "StraggleConfig",
    "FaultKind", "ByzantineMode", "FaultConfig",
    "StrategyConfig", "ModelConfig", "LauncherConfig", "InprocessLauncherConfig", "LocalLauncherConfig",
    "KubernetesLauncherConfig", "TokenSecretConfig", "RayLauncherConfig", "RayLocalClusterConfig", "RayStrategy",
    "LockstepConfig", "GROUP_SCHEMAS", "register_configs",
    "help_of",
]



def doc(default: Any = MISSING, help: str = "", factory: Any = None, **rules: Any) -> Any:  # noqa: A002
    """A dataclass field with its documentation (``metadata["help"]``) and value rules.

    ``rules`` (checked by :mod:`controller.config.validate` and used in its error sentences):
    ``lo``/``hi`` bounds (``lo_open``/``hi_open`` for strict ones), ``unit="duration"`` for values given
    in seconds or as strings like ``1ms``, ``choices`` for a closed set of strings.
    """
    meta = {"help": help, **rules}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def help_of(cls: type, name: str) -> str:
    for f in fields(cls):
        if f.name == name:
            return f.metadata.get("help", "")
    raise KeyError(name)


def default_of(cls: type, name: str) -> Any:
    """The schema's default of ``cls.name`` (an enum's value; a factory's product)."""
    for f in fields(cls):
        if f.name == name:
            # (dataclasses' MISSING marks a factory's field; omegaconf's MISSING, "???", a required one)
            v = f.default_factory() if f.default is dataclasses.MISSING else f.default
            return v.value if isinstance(v, Enum) else v
    raise KeyError(name)


# ---------------------------------------------------------------- closed sets
class Placement(str, Enum):
    round_robin = "round_robin"
    block = "block"
    ps_alone = "ps_alone"


class Optimizer(str, Enum):
    sgd = "sgd"
    adam = "adam"


class Partition(str, Enum):
    iid = "iid"
    dirichlet = "dirichlet"
    non_iid = "non_iid"


class Discipline(str, Enum):
    fifo = "fifo"
    fair = "fair"
    unlimited = "unlimited"


class NetworkModel(str, Enum):
    ideal = "ideal"
    tcp = "tcp"


class Collective(str, Enum):
    ideal = "ideal"
    gloo = "gloo"


class ComputeModelName(str, Enum):
    profiled = "profiled"
    measured = "measured"
    constant = "constant"
    distribution = "distribution"
    analytic = "analytic"


class Distribution(str, Enum):
    lognormal = "lognormal"
    normal = "normal"
    weibull = "weibull"
    exponential = "exponential"


class Windows(str, Enum):
    direct = "direct"
    hub = "hub"


class RecoveryAgents(str, Enum):
    restart = "restart"
    fail = "fail"


class ResumeMode(str, Enum):
    never = "never"
    auto = "auto"


class BatchMode(str, Enum):
    off = "off"
    loop = "loop"
    vmap = "vmap"
    auto = "auto"


class TraceMode(str, Enum):
    full = "full"
    sample = "sample"
    window = "window"
    off = "off"


class LogLevel(str, Enum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


class PullPolicy(str, Enum):
    Always = "Always"
    IfNotPresent = "IfNotPresent"
    Never = "Never"


class RayStrategy(str, Enum):
    """A Ray placement group strategy."""

    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


# ----------------------------------------------------------- plain sections
@dataclass
class StopConfig:
    updates: Optional[int] = doc(30000, "global model updates; null = no limit", lo=1)
    virtual_time: Any = doc(None, "virtual seconds (or a string like 90s, 2min); null = no limit", unit="duration", lo=0, lo_open=True)


@dataclass
class EvalConfig:
    every: int = doc(5000, "evaluate the global model every N updates (0 = only at the end); an observer: no "
                           "virtual time", lo=0)
    samples: int = doc(10000, "test samples used", lo=1)


@dataclass
class DataConfig:
    root: Optional[str] = doc(None, "a directory with the IDX files or a torchvision FashionMNIST/raw layout; "
                                    "null = Debian's dataset-fashion-mnist package")
    partition: Partition = doc(Partition.iid, "how the training set is split over the data-holding vworkers")
    alpha: float = doc(0.5, "dirichlet: the concentration", lo=0, lo_open=True)
    major: float = doc(0.8, "non_iid: the share of each client's samples from its two classes", lo=0, lo_open=True, hi=1)
    placement: str = doc("local", "local (each worker has its shard) | end_devices (sim4DistrDL: the shard lives on "
                                  "the worker's end devices and batches travel over the network)",
                         choices=("local", "end_devices"))
    end_devices: int = doc(1, "end_devices: end devices (data vworkers d0, d1, ...) per training worker", lo=1)
    cache: str = doc("none", "end_devices: none | lru (a cache of samples on each training worker's node)",
                     choices=("none", "lru"))
    cache_size: int = doc(3000, "lru: samples each training worker's cache holds (sim4DistrDL: 3000)", lo=0)
    sample_bytes: Optional[int] = doc(None, "bytes of one sample on the wire; null = 785 (Fashion-MNIST's 28x28 "
                                            "pixels and a label byte, whatever the images' size)", lo=1)
    per_client: Optional[int] = doc(None, "iid: draw this many samples for each data holder (shards may overlap: "
                                          "any number of clients); null = a disjoint split", lo=1)


@dataclass
class TLSConfig:
    """``controller.tls``: TLS on the gRPC service and the direct tensor streams (docs/security.md)."""

    enabled: bool = doc(False, "TLS for the gRPC service and the direct tensor streams")
    cert: Optional[str] = doc(None, "the controller's PEM certificate (also the agents', unless agent_cert)")
    key: Optional[str] = doc(None, "its private key (PEM)")
    ca: Optional[str] = doc(None, "the CA (PEM): agents verify the controller with it, and with client_auth the "
                                  "controller the agents")
    client_auth: bool = doc(True, "mutual TLS: an agent without a certificate signed by ca is refused")
    server_name: Optional[str] = doc(None, "the name in the controller's certificate when agents dial another "
                                           "(null: the host they dial)")
    agent_cert: Optional[str] = doc(None, "the agents' certificate, as the agents see the file (null: cert)")
    agent_key: Optional[str] = doc(None, "the agents' key, as the agents see the file (null: key)")


@dataclass
class ControllerConfig:
    """The gRPC service agents connect to (docs/distributed.md); ``controller.server`` reads it as is."""

    host: str = doc(LOOPBACK, "listen address; 0.0.0.0 when agents run elsewhere (Kubernetes)")
    port: int = doc(0, "0 = a free port", lo=0, hi=65535)
    max_message_bytes: int = doc(DEFAULT_MAX_MESSAGE_BYTES, "no gRPC message is larger; big tensors travel in chunks of "
                                                   "this size", lo=65536, hi=2**31 - 2**20)
    heartbeat_s: float = doc(1.0, "agents send a heartbeat this often (seconds)", lo=0, lo_open=True)
    agent_timeout_s: float = doc(30.0, "an agent silent this long fails the run (seconds)", lo=0, lo_open=True)
    startup_timeout_s: float = doc(300.0, "all agents must register and build their vworkers within this", lo=0, lo_open=True)
    token_file: Optional[str] = doc(None, "file with the shared token; default $LOCKSTEP_TOKEN, else a random "
                                          "per-run token")
    call_timeout_s: float = doc(10.0, "a Register or Beat request must arrive within this (seconds); a stalled "
                                      "caller is cut off", lo=0, lo_open=True)
    max_blob_bytes: Optional[int] = doc(None, "largest tensor (or oversized frame) a peer may send; null = 4 x "
                                              "the model or 4 x max_message_bytes, the larger", lo=1 << 20)
    max_held_bytes: Optional[int] = doc(None, "bytes a peer may have sent before a frame uses them; null = "
                                              "max_blob_bytes + 4 x the model x vworkers", lo=1 << 20)
    tls: TLSConfig = doc(help="TLS certificates (docs/security.md)", factory=TLSConfig)
    windows: Windows = doc(Windows.direct, "who carries the windows between agent processes: direct (the agents "
                                           "exchange each window's events among themselves, docs/distributed.md) | "
                                           "hub (every window through the controller)")


@dataclass
class MetricsConfig:
    port: Optional[int] = doc(None, "Prometheus /metrics of the controller: null = don't serve; 0 = a free port "
                                    "(printed, written to endpoints.json); else that port", lo=0, hi=65535)
    host: str = doc(LOOPBACK, "address to bind; 0.0.0.0 in a pod")
    agent_port: int = doc(0, "port of each agent process's /metrics when port is not null; 0 = a free port "
                             "(9400 in a pod)", lo=0, hi=65535)
    per_worker: bool = doc(False, "add per-vworker series (off: a 1024-worker run must not explode cardinality)")
    linger_s: Any = doc(0.0, "after the run, keep serving this many wall seconds (SIGTERM/SIGINT ends it early)", unit="duration", lo=0)


@dataclass
class TraceConfig:
    mode: TraceMode = doc(TraceMode.full, "trace.json (Chrome trace events, opens in Perfetto): full | sample "
                                          "(the servers and every N-th worker) | window | off")
    sample_every: int = doc(8, "sample: keep the servers and every N-th worker", lo=1)
    window: Optional[List[Any]] = doc(None, "window: [start, end] of virtual time to keep (seconds or strings)")
    max_events: Optional[int] = doc(500000, "stop recording past this many trace events (about 120 bytes each)", lo=1)


@dataclass
class StatelogConfig:
    enabled: bool = doc(True, "statelog.jsonl: every model exchange, for `lockstep inspect`")
    checksum: bool = doc(True, "CRC-32 of each global model version")
    snapshot_every: int = doc(0, "save the global model every N versions into snapshots/ (0 = never); a parameter "
                                 "server's versions: ps_sync, ps_async, ssp only", lo=0)


@dataclass
class PredictorConfig:
    """How ``lockstep predict`` (and ``predict=true``) evaluates the throughput-prediction paper's models."""

    rho_threshold: float = doc(0.5, "Eq. 5: the network utilisation above which the async PS's hybrid model "
                                    "takes the PS solution instead of FCFS (the paper: 0.5 CloudLab, 0.6 AWS)",
                               lo=0, hi=1)
    flow_cap: Any = doc(None, "Algorithm 2.1: the most one flow may use (bytes/s or a string like 10Gbit/s); "
                              "null = the whole link")
    steps: int = doc(20, "Algorithm 2.1: SGD steps simulated per worker (a quarter is warm-up)", lo=2)
    max_events: int = doc(20000, "Algorithm 2.1 is skipped (with a note) when it would take more events", lo=1)


@dataclass
class OutputsConfig:
    """The run directory's files besides the CSVs (docs/kubernetes.md, "Results that survive")."""

    summary_every_s: float = doc(30.0, "rewrite summary.json (\"complete\": false) this often while the run goes, "
                                       "wall seconds; 0 = only at the end", lo=0)
    upload: Optional[str] = doc(None, "at the end copy the run directory to this fsspec URL (s3://bucket/prefix, "
                                      "gs://..., file:///...); null = none")


@dataclass
class RecoveryConfig:
    """What happens when an agent process or the controller dies (docs/recovery.md, DESIGN §11)."""

    agents: RecoveryAgents = doc(RecoveryAgents.restart, "restart: a dead or silent agent (a process, pod or Ray "
                                 "actor) makes the controller restart every agent and replay the run from virtual time 0 "
                                 "to where it was, bit-identically; fail: the run stops with the agent's error")
    max_restarts: int = doc(10, "restarts of the agents one run may make before it fails", lo=0)
    checkpoint_every_s: float = doc(10.0, "wall seconds between coordinated checkpoints of the agents "
                                    "(RUN_DIR/checkpoints; at least 10 times the last one's write time): a lost "
                                    "agent or lockstep resume restarts from the latest instead of virtual time 0; "
                                    "0: never", lo=0)
    resume: ResumeMode = doc(ResumeMode.never, "auto: lockstep run into a run directory that holds an unfinished "
                             "run resumes it (as lockstep resume RUN_DIR; the Helm chart's Job sets it); never: "
                             "start afresh")


@dataclass
class TcpConfig:
    """``network.tcp``: the tcp transport's physical parameters (agents/sim/tcp.py, docs/engine.md)."""

    mtu: int = doc(1500, "IP bytes of a full segment", lo=68)
    header_bytes: int = doc(52, "IPv4 20 + TCP 20 + timestamp option 12 bytes per segment", lo=0)
    frame_bytes: int = doc(38, "Ethernet header 14, FCS 4, preamble 8 and inter-frame gap 12 bytes per frame", lo=0)
    initial_window: int = doc(10, "segments of a new or restarted connection (RFC 6928)", lo=1)
    gso_max_bytes: int = doc(65536, "the largest TSO/GSO packet a host hands its NIC", lo=1)
    nic_burst_bytes: int = doc(72887, "wire bytes the NIC takes ahead of the line rate (a token bucket; the "
                                      "calibration testbed's tbf burst)", lo=1)
    rto_min: Any = doc("200ms", "floor of the retransmission timeout, which also times restart after idle",
                       unit="duration", lo=0)
    clock_hz: int = doc(250, "the kernel's jiffy clock (CONFIG_HZ), the RTO's resolution", lo=1)
    tsq_limit_bytes: int = doc(4194304, "TSQ's cap per connection (net.ipv4.tcp_limit_output_bytes)", lo=0)
    wmem_max_bytes: int = doc(4194304, "the largest send buffer autotuning gives a socket (net.ipv4.tcp_wmem[2]); "
                                       "a sender whose application waits for room in it keeps an unused window",
                              lo=1)
    slow_start_after_idle: bool = doc(True, "restart after idle and decay of unused windows "
                                            "(net.ipv4.tcp_slow_start_after_idle)")
    hystart_delay: bool = doc(True, "HyStart: leave slow start when a round's minimum RTT rises")
    hystart_ack_train: bool = doc(True, "HyStart: leave slow start on a train of ACKs half an RTT long")
    small_messages_first: bool = doc(True, "every connection carried small messages before its first transfer "
                                           "(gloo's setup, barrier, notifications), so CUBIC's minimum RTT, "
                                           "HyStart's reference, is a small message's round trip")
    host_latency: Any = doc("257us", "a delivered message reaches its application this much after its last byte "
                                     "(fitted by lockstep calibrate)", unit="duration", lo=0)
    host_jitter: Any = doc("0us", "mean of a keyed exponential extra delay per delivered message", unit="duration",
                           lo=0)
    ack_delay: Any = doc("30us", "the hosts' share of a round trip beyond host_rtt: a sender acts on each ACK "
                                 "host_rtt plus a keyed exponential draw of this mean after it arrived, a connection's "
                                 "ACKs kept in order (measured on the calibration testbed)", unit="duration", lo=0)
    host_rtt_min: Any = doc("3us", "the hosts' share of a connection's minimum RTT (stacks, bridge), which every ACK "
                                   "waits and TSO autosizing reads: drawn per connection, keyed, uniform in "
                                   "[host_rtt_min, host_rtt_max] (measured on the calibration testbed)",
                            unit="duration", lo=0)
    host_rtt_max: Any = doc("80us", "the upper end of host_rtt_min's range", unit="duration", lo=0)
    delayed_ack: bool = doc(False, "the receiver acknowledges like Linux: at once when two segments are due or in "
                                   "quick-ACK mode, a short packet when the application reads it (not in pingpong "
                                   "mode), else after delack or with its own data (gloo's op preamble then leaves "
                                   "as a packet of its own); false: every packet at once")
    delack: Any = doc("40ms", "delayed_ack: the delayed-ACK timer (TCP_DELACK_MIN)", unit="duration", lo=0)


# ------------------------------------------------------------------ groups
@dataclass
class NetworkConfig:
    """``network=``: NICs and latencies (DESIGN §4.1, docs/engine.md)."""

    latency: Any = doc("100us", "one-way latency: seconds, a string like 100us, {distribution: normal|lognormal|"
                                "weibull, ...} drawn per message (redrawn below 0 or its min, so at least 5 % of "
                                "the draws must be above), or {matrix: [[...]], groups: [...]} (groups: one region "
                                "index per vworker, workers first, then servers)")
    bandwidth: Any = doc("1Gbit/s", "NIC egress rate per vworker: bytes/s or a string like 10Gbit/s; a list (one "
                                    "per worker); or {distribution: weibull, scale, shape, loc, unit: Mbit/s} "
                                    "drawn per vworker (redrawn while not > 0, so at least 5 % must be)")
    bandwidth_in: Any = doc(None, "NIC ingress rate, same forms; null = the same as bandwidth")
    discipline: Discipline = doc(Discipline.fair, "how a NIC shares its rate among transfers, both directions")
    egress: Optional[Discipline] = doc(None, "the discipline of the egress side; null = discipline")
    ingress: Optional[Discipline] = doc(None, "the discipline of the ingress side; null = discipline")
    efficiency: float = doc(1.0, "goodput / line rate, in (0, 1] (TCP over Ethernet: about 0.94)", lo=0, lo_open=True, hi=1)
    model: NetworkModel = doc(NetworkModel.ideal, "ideal: the closed-form stations (Eq. 7, 8, 11 exactly) | tcp: "
                                                  "Linux TCP over Ethernet, bandwidth the line rate (docs/engine.md); "
                                                  "lockstep run starts from the network=tcp option (conf/config.yaml), "
                                                  "network=ideal and the other presets from ideal")
    tcp: TcpConfig = doc(help="the tcp model's parameters (used with model: tcp)", factory=TcpConfig)
    topology: Any = doc("star", "star (one switch: the per-NIC model above) | tree (sim4DistrDL's edge network: "
                                "cloud, edge nodes, end devices) | fat_tree (oversubscribed leaf-spine) | {links: "
                                "[[a, b, bandwidth, latency], ...], attach: {vworker: node}, routes: [[a, ..., b], "
                                "...]}; flows share every link on their route max-min (network.model=ideal only; docs/engine.md)")
    links: TopologyLinksConfig = doc(help="the links of the tree and fat_tree presets", factory=lambda: TopologyLinksConfig())


@dataclass
class TopologyLinksConfig:
    """``network.links``: the preset topologies' links (a custom topology lists its own)."""

    bandwidth: Any = doc("1Gbit/s", "bytes/s of every link (both directions), or a string like 1Gbit/s")
    latency: Any = doc("100us", "one-way latency of every link", unit="duration", lo=0)
    edges: int = doc(3, "tree: edge nodes under the cloud (sim4DistrDL: 3)", lo=1)
    ends_per_edge: int = doc(1, "tree: end devices under each edge node", lo=1)
    hosts_per_leaf: int = doc(4, "fat_tree: hosts (one vworker each) per leaf switch", lo=1)
    spines: int = doc(2, "fat_tree: spine switches, each linked to every leaf", lo=1)
    oversubscription: float = doc(4.0, "fat_tree: a leaf's host bandwidth over its uplink bandwidth", lo=1)


@dataclass
class StraggleConfig:
    probability: float = doc(0.0, "chance that a compute call straggles (a keyed draw per vworker and call)", lo=0, hi=1)
    factor: float = doc(1.0, "slowdown of a straggling call", lo=0, lo_open=True)


@dataclass
class ComputeConfig:
    """``compute=``: how long a real computation takes in virtual time (DESIGN §4.2)."""

    model: ComputeModelName = doc(MISSING, "profiled | measured | constant | distribution | analytic")
    gradient: Any = doc(None, "seconds per gradient (constant; a fixed kind of distribution)", unit="duration", lo=0)
    update: Any = doc(None, "seconds per optimizer step (constant; a fixed kind of distribution)", unit="duration", lo=0)
    aggregate: Any = doc(None, "seconds per aggregation (constant; a fixed kind of distribution)", unit="duration", lo=0)
    profile: Optional[str] = doc(None, "profiled: the emulated machine, a device profile (conf/profiles/<name>.json, "
                                       "or a path to one; made by `lockstep profile`); its durations travel with "
                                       "the plan, so virtual times are the same on every host; calls it lacks are "
                                       "timed on this host (summary.json: profile_fallbacks, portable). null = time "
                                       "this host")
    runs: int = doc(5, "profiled: timed runs per signature (the median is kept)", lo=1)
    db: Optional[str] = doc(None, "profiled: the profile database (default ~/.cache/lockstep/profiles.json)")
    distribution: Distribution = doc(Distribution.lognormal, "distribution: lognormal | normal | weibull | "
                                                             "exponential")
    params: List[float] = doc(help="distribution: its parameters in seconds (the thesis' log-normal fit): "
                                   "lognormal [mu, sigma] of the log, normal [mean, std], weibull [scale, shape] or "
                                   "[scale, shape, loc], exponential [scale]; a negative draw is drawn again, so at "
                                   "least 5 % of the draws must be >= 0",
                              factory=lambda: [0.165, 0.8632])
    kinds: List[str] = doc(help="distribution: the kinds drawn from it; other kinds use the constants",
                           factory=lambda: ["gradient"])
    peak_flops: float = doc(1.0e12, "analytic: the device's peak FLOP/s", lo=0, lo_open=True)
    speed: Any = doc(None, "per-worker slowdown factors: null (all 1.0), a list, {classes: [{fraction: 0.5, "
                           "factor: 2.0}]} (consecutive workers from w0), or {distribution: lognormal|normal|"
                           "uniform, ...} (keyed per worker)")
    stragglers: Any = doc(None, "fixed extra factors by vworker name, e.g. {w3: 4.0}; null = none")
    straggle: StraggleConfig = doc(help="injected stragglers, e.g. {probability: 0.05, factor: 5.0} (a keyed draw "
                                        "per call); probability 0 = none", factory=StraggleConfig)
    jitter: float = doc(0.0, "sigma of a keyed log-normal factor per call (0 = none)", lo=0)
    start_spread: Any = doc(0.0, "each vworker starts after a keyed uniform delay in [0, start_spread): processes "
                                 "that leave their start-up barrier at different times (0 = all at t = 0)",
                            unit="duration", lo=0)
    start_offsets: Any = doc(None, "fixed start delays by vworker name, added to start_spread's draw, e.g. "
                                   "{ps0: 2ms, w3: 12ms}: when each process leaves its start-up (lockstep validate "
                                   "sets gloo's barrier here); null = none")
    batch: BatchMode = doc(BatchMode.loop, "deferred compute (docs/batching.md): off (eager) | loop (deferred, "
                                           "bit-identical to off) | vmap (same-shaped gradients as one "
                                           "torch.func.vmap call; floats differ in the last bits) | auto (vmap "
                                           "where a start-up probe found it faster, per call signature and batch "
                                           "size)")
    max_batch: int = doc(64, "the most deferred calls run together in one batch", lo=1)
    overlap: Any = doc("auto", "run deferred calls early on a background thread while the vworkers and windows "
                               "go on: auto (in an agent process beside other agents, with at least 2 usable "
                               "CPUs) | true | false")
    layerwise: bool = doc(False, "layer-wise overlap (wait-free backprop): each layer's gradient leaves when its "
                                 "backward pass ends and a layer's forward pass waits only for its own parameters "
                                 "(ps_sync, ps_async, ssp and ring_allreduce, refused for the others; "
                                 "docs/predict.md)")
    forward_fraction: float = doc(1 / 3, "the share of a gradient's duration spent in the forward pass, where "
                                         "per-layer times are split from a whole-call duration (backward ~ 2x "
                                         "forward)", lo=0, lo_open=True, hi=1, hi_open=True)
    allreduce_share: float = doc(0.0, "the share of the device an all-reduce occupies: computation overlapping "
                                      "one runs at 1 - share of its speed (Tianshu: 16 of a V100's 80 SMs = 0.2)",
                                 lo=0, hi=1, hi_open=True)


class FaultKind(str, Enum):
    crash = "crash"
    partition = "partition"
    loss = "loss"
    duplicate = "duplicate"
    slow_link = "slow_link"
    straggler = "straggler"
    byzantine = "byzantine"


class ByzantineMode(str, Enum):
    sign_flip = "sign_flip"
    noise = "noise"
    scale = "scale"


@dataclass
class FaultConfig:
    """One entry of ``faults:`` (docs/faults.md): what goes wrong, to whom, over ``[at, until)`` in virtual time."""

    kind: FaultKind = doc(MISSING, "crash | partition | loss | duplicate | slow_link | straggler | byzantine")
    at: Any = doc(0.0, "when it starts (virtual seconds, or a string like 500ms)", unit="duration", lo=0)
    until: Any = doc(None, "when it ends, exclusive (a crashed vworker recovers, a partition heals); null = never",
                     unit="duration", lo=0)
    workers: Optional[List[str]] = doc(None, "the vworkers it hits, by name (crash, straggler, byzantine, slow_link; "
                                             "loss/duplicate: the senders, null = all)")
    fraction: Optional[float] = doc(None, "instead of workers: this share of the training workers, a keyed draw "
                                          "(seed, fault index); never the result vworker", lo=0, lo_open=True, hi=1)
    groups: Optional[List[List[str]]] = doc(None, "partition: two or more disjoint lists of vworker names; messages "
                                                  "between groups wait until it heals")
    probability: float = doc(1.0, "loss, duplicate, straggler: the chance per message / compute call (a keyed draw)",
                             lo=0, hi=1)
    factor: float = doc(1.0, "slow_link: the share of the NIC rate left, in (0, 1); straggler: the slowdown "
                             "(> 1); byzantine scale: the gradient's multiplier (any number, e.g. -4)")
    mode: ByzantineMode = doc(ByzantineMode.sign_flip, "byzantine: sign_flip | noise (Gaussian, std, keyed) | "
                                                       "scale (factor)")
    std: float = doc(0.0, "byzantine noise: the standard deviation added to each gradient element", lo=0)


@dataclass
class StrategyConfig:
    """``strategy=``: the Strategy class and its own settings (docs/strategies.md)."""

    _target_: str = doc(MISSING, "the Strategy class (a dotted path)")
    name: Optional[str] = doc(None, "the name runs and plots show")


@dataclass
class ShardedPSConfig(StrategyConfig):
    shards: int = doc(1, "PS shards (parameters split by tensor over ps0..ps{S-1})", lo=1, hi=1024)
    collective: Collective = doc(Collective.ideal, "ideal: plain messages | gloo: torch.distributed/gloo's send and "
                                                   "recv (each receive announced to its sender by a 48-byte "
                                                   "notification, a send that finds none announced by one and "
                                                   "started when it comes, a 48-byte preamble per message)")
    start_after: Any = doc(0.0, "the PS sends its first parameters this long after the run starts, so the "
                                "workers' receives are posted first (a PS that loads or sets up before it "
                                "serves; lockstep validate's asynchronous PS, like realrun's)", unit="duration",
                           lo=0)


@dataclass
class SSPConfig(ShardedPSConfig):
    staleness_bound: int = doc(3, "the fastest worker runs at most this many steps ahead of the slowest; 0 = BSP", lo=0)


@dataclass
class RingConfig(StrategyConfig):
    segment: Any = doc(None, "bytes per segment, >= 4 (a number or a size like 1MB; each sent after a receiver-ready "
                             "message, like gloo); null = whole chunks; collective=ideal only")
    collective: Collective = doc(Collective.ideal, "ideal: whole chunks (Eq. 11 exactly) | gloo: gloo's ring (1 MiB "
                                                   "segments, two in flight, receiver-ready notifications)")
    start_after: Any = doc(0.0, "the ring's first member starts this long after the others (a rank 0 that leaves "
                                "its set-up last: lockstep validate's ring, like realrun's, where rank 0 leaves "
                                "init_process_group one one-way latency after the others)", unit="duration", lo=0)


@dataclass
class HierarchicalConfig(RingConfig):
    group_size: int = doc(4, "workers per group (reduce inside, ring between leaders, broadcast back)", lo=1)


@dataclass
class LocalSGDConfig(RingConfig):
    local_steps: int = doc(4, "local steps on each replica between averages", lo=1)


@dataclass
class GossipConfig(StrategyConfig):
    topology: str = doc("ring", "ring | random (a keyed random degree-regular graph)", choices=("ring", "random"))
    degree: int = doc(2, "random: the degree of the graph", lo=1)
    graph_seed: int = doc(0, "random: the key of the graph", lo=0)


@dataclass
class FedAvgConfig(StrategyConfig):
    fraction: float = doc(1.0, "share of clients per round", lo=0, lo_open=True, hi=1)
    local_steps: Optional[int] = doc(None, "local SGD steps per round; null = local_epochs epochs over the shard", lo=1)
    local_epochs: int = doc(1, "local epochs per round when local_steps is null", lo=1)
    weighting: str = doc("data", "data (shard size) | samples (trained this round) | uniform", choices=("data", "samples", "uniform"))
    round_timeout: Any = doc(None, "a round ends this long after it starts, with the updates that came (clients "
                                   "that crashed or fell behind miss it; docs/strategies.md); null = wait for every "
                                   "chosen client", unit="duration",
                             lo=0, lo_open=True)


@dataclass
class FedAsyncConfig(StrategyConfig):
    staleness: str = doc("polynomial", "constant | polynomial: (t-tau+1)^-a | hinge: 1 if t-tau <= b else "
                                       "1/(a(t-tau-b)+1)", choices=("constant", "polynomial", "hinge"))
    a: float = doc(0.5, "the staleness function's exponent / slope", lo=0)
    b: int = doc(4, "hinge: staleness tolerated at full weight", lo=0)
    alpha: float = doc(1.0, "base mixing weight", lo=0, lo_open=True, hi=1)
    local_steps: Optional[int] = doc(1, "local SGD steps per round; null = local_epochs epochs", lo=1)
    local_epochs: int = doc(1, "local epochs per round when local_steps is null", lo=1)


@dataclass
class MicrobenchConfig(StrategyConfig):
    kind: str = doc("p2p", "p2p: w0 -> w1 transfer time | fanin: w1..wK -> w0 at once, until the last arrives",
                    choices=("p2p", "fanin"))
    gap: float = doc(0.05, "seconds between repetitions", lo=0)


@dataclass
class ModelConfig:
    """``model=``: any ``nn.Module`` by ``_target_``; other keys are constructor arguments."""

    _target_: str = doc(MISSING, "the nn.Module class (a dotted path)")


@dataclass
class MLPConfig(ModelConfig):
    hidden: List[int] = doc(help="widths of the hidden layers", factory=lambda: [200])


@dataclass
class FlatConfig(ModelConfig):
    bytes: Any = doc(1000000, "bytes of the one float32 tensor (rounded down to whole floats), or a size like 10MB")


@dataclass
class LauncherConfig:
    """``launcher=``: where the agents run (DESIGN §10, docs/distributed.md)."""

    name: str = doc(MISSING, "inprocess | local | kubernetes | ray")


@dataclass
class InprocessLauncherConfig(LauncherConfig):
    name: str = "inprocess"


@dataclass
class LocalLauncherConfig(LauncherConfig):
    name: str = "local"
    start_method: str = doc("forkserver", "how agent processes start: forkserver (forked from a server process "
                                          "that imported torch and lockstep once per controller process: agents are "
                                          "Ready sooner and share those pages) | spawn (a fresh `python -m agents` "
                                          "each)", choices=("forkserver", "spawn"))
    stop_grace_s: float = doc(1.0, "seconds agents get to exit after the run (or Ctrl-C) before SIGTERM, then "
                                   "SIGKILL", lo=0)


@dataclass
class TokenSecretConfig:
    name: Optional[str] = doc(None, "an existing Secret holding the token; null = the launcher creates one for "
                                    "the run (owned like the pods) and deletes it at the end")
    key: str = doc("token", "the key of the token in that Secret")


@dataclass
class KubernetesLauncherConfig(LauncherConfig):
    name: str = "kubernetes"
    namespace: Optional[str] = doc(None, "namespace of the agent pods; null = the in-cluster namespace, else the "
                                         "kubeconfig context's, else default")
    kubeconfig: Optional[str] = doc(None, "a kubeconfig file; null = in-cluster credentials in a pod, else "
                                          "$KUBECONFIG or ~/.kube/config")
    context: Optional[str] = doc(None, "kubeconfig context; null = its current context")
    image: Optional[str] = doc("lockstep:0.1.0", "image of the agent pods (must contain lockstep); null = the "
                                                 "image of the agent container in pod_template_file")
    image_pull_policy: Optional[PullPolicy] = doc(PullPolicy.IfNotPresent, "Always | IfNotPresent | Never; null = "
                                                                           "Kubernetes' default for the tag")
    controller_address: Optional[str] = doc(None, "host:port the agent pods dial; null = the controller's listen "
                                                  "address (in the chart: the Service's DNS name)")
    pod_template_file: Optional[str] = doc(None, "a Pod manifest (YAML) whose spec the agent pods start from")
    owner_pod: Optional[str] = doc(None, "the controller's pod (agent pods get an ownerReference to it); null = "
                                         "$LOCKSTEP_POD_NAME or $POD_NAME")
    instance: Optional[str] = doc(None, "app.kubernetes.io/instance label of the agent pods; null = the run id")
    startup_timeout_s: float = doc(600.0, "seconds an agent pod may stay Pending before the run fails", lo=0, lo_open=True)
    unschedulable_grace_s: float = doc(0.0, "seconds an agent pod may stay Unschedulable before the run fails", lo=0)
    api_error_grace_s: float = doc(60.0, "seconds check() tolerates an unreachable API server, from the start of "
                                         "the first failed listing (a listing's request times out after a third "
                                         "of it, at most 10 s)", lo=0)
    check_interval_s: float = doc(1.0, "check() lists the agent pods at most this often (seconds)", lo=0, lo_open=True)
    delete_grace_period_s: int = doc(10, "grace period of agent pods deleted at the end of a run", lo=0)
    token_secret: TokenSecretConfig = doc(help="an existing Secret holding the token", factory=TokenSecretConfig)


RAY_MIN_OBJECT_STORE_BYTES = 78_643_200  # Ray refuses a smaller object store


@dataclass
class RayLocalClusterConfig:
    """The private Ray cluster ``launcher=ray`` starts when ``launcher.address`` is null (docs/ray.md)."""

    num_cpus: Optional[int] = doc(None, "CPUs it offers; null = enough for every agent (agents x cpus_per_agent), "
                                        "at least this machine's count", lo=1)
    num_gpus: Optional[int] = doc(None, "GPUs it offers; null = those Ray finds", lo=0)
    resources: Any = doc(None, "custom resources it offers, e.g. {lab_node: 8}; null = none")
    object_store_memory: Optional[int] = doc(200_000_000, "bytes of Ray's object store (lockstep moves tensors over "
                                                          "gRPC, so little is needed); null = Ray's default, 30 % of "
                                                          "memory", lo=RAY_MIN_OBJECT_STORE_BYTES)


@dataclass
class RayLauncherConfig(LauncherConfig):
    """``launcher=ray``: every agent a Ray actor (controller/launchers/ray.py, docs/ray.md)."""

    name: str = "ray"
    address: Optional[str] = doc(None, "the Ray cluster: null = a private one for the run on 127.0.0.1, stopped "
                                       "after it; auto = the cluster `ray start --head` runs on this machine; "
                                       "HOST:PORT of a running cluster's head; ray://HOST:PORT (Ray Client). "
                                       "conf/launcher/ray.yaml defaults it to $RAY_ADDRESS")
    cpus_per_agent: float = doc(1.0, "CPUs each agent reserves (its placement group bundle)", lo=0, lo_open=True)
    gpus_per_agent: float = doc(0.0, "GPUs each agent reserves: a fraction up to 1 shares a GPU (0.25: four agents "
                                     "on one), above 1 a whole number", lo=0)
    memory_per_agent: Optional[int] = doc(None, "bytes of memory Ray reserves per agent; null = none", lo=1)
    resources_per_agent: Any = doc(None, "custom resources per agent, e.g. {lab_node: 1}; null = none")
    strategy: RayStrategy = doc(RayStrategy.PACK, "placement group strategy: PACK (few nodes) | SPREAD | "
                                                  "STRICT_PACK (one node) | STRICT_SPREAD (a node per agent)")
    runtime_env: Any = doc(None, "a Ray runtime_env for the agent actors (pip, env_vars, working_dir, ...); null = "
                                 "none; Ray shows it to anyone reading its dashboard, so never the token")
    controller_address: Optional[str] = doc(None, "HOST:PORT the agents dial; null = controller.host:port (with "
                                                  "controller.host=0.0.0.0, this machine's address as Ray knows it)")
    namespace: str = doc("lockstep", "Ray namespace of the actors, named lockstep-<run id>-agent-<N>")
    startup_timeout_s: float = doc(600.0, "seconds the placement group may stay unplaced (an autoscaler adding "
                                          "nodes) before the run fails", lo=0, lo_open=True)
    log_poll_s: float = doc(1.0, "agent log lines are copied into RUN_DIR/agents/agent-N.log this often (seconds)",
                            lo=0, lo_open=True)
    stop_grace_s: float = doc(5.0, "seconds agents get to finish after the run before their actors are killed", lo=0)
    local: RayLocalClusterConfig = doc(help="the private cluster (address null)", factory=RayLocalClusterConfig)


# -------------------------------------------------------------- the whole run
@dataclass
class LockstepConfig:
    """The primary config (``conf/config.yaml`` starts from it)."""

    strategy: Any = MISSING
    model: Any = MISSING
    network: NetworkConfig = MISSING
    compute: ComputeConfig = MISSING
    launcher: Any = MISSING
    run_id: Optional[str] = doc(None, "the run's id; null = <timestamp>-<config hash>")
    seed: int = doc(0, "the key of every random draw", lo=0)
    workers: int = doc(64, "training vworkers (a PS adds its own)", lo=1)
    agents: int = doc(1, "agent processes the vworkers are spread over", lo=1)
    placement: Placement = doc(Placement.round_robin, "round_robin | block | ps_alone (the servers alone on "
                                                      "agent 0; refused for a strategy without one)")
    batch_size: Any = doc(16, "per worker: an int, or a list with one entry per worker")
    lr: float = doc(0.005, "learning rate (async PS with 64 workers diverges at larger rates: docs/engine.md)", lo=0, lo_open=True)
    momentum: float = doc(0.0, "SGD momentum, in [0, 1)", lo=0, hi=1, hi_open=True)
    optimizer: Optimizer = doc(Optimizer.sgd, "the optimizer of the model holder (a PS, a local learner); fedavg and "
                                           "fedasync clients train with SGD, so adam is refused there")
    device: str = doc("cpu", "cpu | cuda | cuda:N")
    threads: int = doc(1, "torch intra-op threads per agent process", lo=1)
    memory: str = doc("auto", "what an agent process's allocator does with freed tensors: compact (glibc's mmap "
                              "threshold fixed at 128 KiB, as MALLOC_MMAP_THRESHOLD_=131072 would: freed tensors "
                              "go back to the OS at once; ~17 % more CPU on small models) | fast (glibc's "
                              "default: freed memory is kept for reuse, and a heap that grew stays grown) | auto "
                              "(compact where an agent hosts 1000 vworkers or more)",
                       choices=("auto", "compact", "fast"))
    stop: StopConfig = doc(help="stop conditions", factory=StopConfig)
    eval: EvalConfig = doc(help="evaluation of the global model", factory=EvalConfig)
    data: DataConfig = doc(help="the training data", factory=DataConfig)
    controller: ControllerConfig = doc(help="the controller's gRPC service", factory=ControllerConfig)
    metrics: MetricsConfig = doc(help="Prometheus endpoints", factory=MetricsConfig)
    trace: TraceConfig = doc(help="trace.json", factory=TraceConfig)
    statelog: StatelogConfig = doc(help="statelog.jsonl", factory=StatelogConfig)
    outputs: OutputsConfig = doc(help="summary.json while running, uploads", factory=OutputsConfig)
    recovery: RecoveryConfig = doc(help="agent restarts and resuming a run (docs/recovery.md)", factory=RecoveryConfig)
    predict: bool = doc(False, "also predict the throughput with the throughput-prediction paper's models "
                               "(`lockstep predict`) and write it into summary.json beside the emulated figures")
    predictor: PredictorConfig = doc(help="settings of the predictions", factory=PredictorConfig)
    progress: bool = doc(True, "progress bar on stderr")
    log_level: LogLevel = doc(LogLevel.INFO, "DEBUG | INFO | WARNING | ERROR")
    faults: List[FaultConfig] = doc(help="injected faults, each keyed and at virtual times (docs/faults.md); "
                                         "[] = none", factory=list)


GROUP_SCHEMAS: dict[str, dict[str, type]] = {
    "network": {"base_network": NetworkConfig},
    "compute": {"base_compute": ComputeConfig},
    "strategy": {"base_strategy": StrategyConfig, "base_sharded_ps": ShardedPSConfig, "base_ssp": SSPConfig,
                 "base_ring": RingConfig, "base_hierarchical": HierarchicalConfig, "base_local_sgd": LocalSGDConfig,
                 "base_gossip": GossipConfig, "base_fedavg": FedAvgConfig, "base_fedasync": FedAsyncConfig,
                 "base_microbench": MicrobenchConfig},
    "model": {"base_model": ModelConfig, "base_mlp": MLPConfig, "base_flat": FlatConfig},
    "launcher": {"base_inprocess": InprocessLauncherConfig, "base_local": LocalLauncherConfig,
                 "base_kubernetes": KubernetesLauncherConfig, "base_ray": RayLauncherConfig},
}
"""The schema of each group option: ``conf/<group>/<option>.yaml`` names one of these first in its defaults."""

ONE_LEARNER = {"workers": 1}
"""``strategy=sgd``'s top-level ``workers``: conf/strategy/sgd.yaml lists ``/one_learner`` in its defaults (a key
of the option itself would be ``strategy.workers``); a ``workers=`` override or an experiment still wins."""


def register_configs() -> None:
    """Register the schemas in Hydra's ConfigStore (idempotent; called before Hydra composes)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=LockstepConfig)
    cs.store(name="one_learner", node=ONE_LEARNER, package="_global_")
    for group, nodes in GROUP_SCHEMAS.items():
        for name, node in nodes.items():
            cs.store(group=group, name=name, node=node)


def schema_of(obj: Any) -> type | None:
    """The dataclass an OmegaConf node was built from, if any."""
    from omegaconf import OmegaConf

    t = OmegaConf.get_type(obj) if obj is not None else None
    return t if t is not None and is_dataclass(t) else None


def typed(cls: type, mapping: Any) -> Any:
    """A schema object from a plain mapping (OmegaConf checks every key and type), e.g. for tests and tools."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), mapping))
