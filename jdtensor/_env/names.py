"""Every variable's name, spelled once: DTensor's, jdtensor's, and JAX's that
jdtensor reads.

PURE: standard library only.
"""

from __future__ import annotations

__all__ = ["CUDA_VISIBLE_DEVICES", "DTENSOR_CLIENT_ID", "DTENSOR_ENABLE_HEARTBEAT",
           "DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION",
           "DTENSOR_GPU_USE_NCCL_COMMUNICATION", "DTENSOR_JOBS", "DTENSOR_JOB_NAME",
           "DTENSOR_NUM_CLIENTS", "JAX_COMPILATION_CACHE_DIR", "JAX_ENABLE_COMPILATION_CACHE", "JAX_NUM_CPU_DEVICES",
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "JAX_PLATFORMS", "JDTENSOR_CLUSTER_DETECTION",
           "JDTENSOR_COMPILE_CACHE", "JDTENSOR_COORDINATION_TIMEOUT", "JDTENSOR_COORDINATOR_BIND_ADDRESS",
           "JDTENSOR_DEADLOCK_TIMEOUT",
           "JDTENSOR_HEARTBEAT_PERIOD", "JDTENSOR_HEARTBEAT_POLICY",
           "JDTENSOR_HEARTBEAT_TIMEOUT", "JDTENSOR_INIT_TIMEOUT",
           "JDTENSOR_K8S_JOB_NAME", "JDTENSOR_K8S_NUM_JOBS",
           "JDTENSOR_K8S_PODS_PER_JOB", "JDTENSOR_K8S_SUBDOMAIN", "JDTENSOR_LOCAL_CLIENT_ID",
           "JDTENSOR_LOCAL_NUM_CLIENTS", "JDTENSOR_REPORT_DIR",
           "JDTENSOR_RESTART_COUNT", "JDTENSOR_CLIENT_PROCESS", "JDTENSOR_RUN_SECRET", "JDTENSOR_SHARE_GPUS",
           "JDTENSOR_SHUTDOWN_TIMEOUT",
           "JDTENSOR_SIMULATED_TPU_TOPOLOGY", "JDTENSOR_STALL_KILL_ALL_WAITING",
           "JDTENSOR_STALL_FLOOR", "JDTENSOR_STALL_LEARN",
           "JDTENSOR_STALL_TIMEOUT", "JDTENSOR_STRAGGLER_THRESHOLD",
           "JDTENSOR_STRAGGLER_WINDOW", "JDTENSOR_STUCK_TIMEOUT", "JDTENSOR_TRACE_DIR",
           "XDG_RUNTIME_DIR", "XLA_FLAGS",
           "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_SETTINGS"]


# DTensor's own variables (TF names, read by TF DTensor too).
DTENSOR_CLIENT_ID = "DTENSOR_CLIENT_ID"
DTENSOR_JOBS = "DTENSOR_JOBS"
DTENSOR_JOB_NAME = "DTENSOR_JOB_NAME"
DTENSOR_NUM_CLIENTS = "DTENSOR_NUM_CLIENTS"  # legacy (TF <= 2.10)
DTENSOR_ENABLE_HEARTBEAT = "DTENSOR_ENABLE_HEARTBEAT"
DTENSOR_GPU_USE_NCCL_COMMUNICATION = "DTENSOR_GPU_USE_NCCL_COMMUNICATION"
DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION = "DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION"

# jdtensor's own knobs for the JAX runtime underneath.
JDTENSOR_INIT_TIMEOUT = "JDTENSOR_INIT_TIMEOUT"
# How long JAX's coordination service waits for a silent client (its own
# heartbeat, not jdtensor's). JDTENSOR_HEARTBEAT_TIMEOUT is its deprecated
# name, read for one release.
JDTENSOR_COORDINATION_TIMEOUT = "JDTENSOR_COORDINATION_TIMEOUT"
JDTENSOR_HEARTBEAT_TIMEOUT = "JDTENSOR_HEARTBEAT_TIMEOUT"
JDTENSOR_SHUTDOWN_TIMEOUT = "JDTENSOR_SHUTDOWN_TIMEOUT"
JDTENSOR_COORDINATOR_BIND_ADDRESS = "JDTENSOR_COORDINATOR_BIND_ADDRESS"
JDTENSOR_HEARTBEAT_PERIOD = "JDTENSOR_HEARTBEAT_PERIOD"
JDTENSOR_HEARTBEAT_POLICY = "JDTENSOR_HEARTBEAT_POLICY"
JDTENSOR_STUCK_TIMEOUT = "JDTENSOR_STUCK_TIMEOUT"
JDTENSOR_STALL_TIMEOUT = "JDTENSOR_STALL_TIMEOUT"
JDTENSOR_STALL_KILL_ALL_WAITING = "JDTENSOR_STALL_KILL_ALL_WAITING"
# Every client idle in a collective this long is a deadlock: the run ends
# (NCCL's watchdog's 10 minutes by default; 0: only the warning).
JDTENSOR_DEADLOCK_TIMEOUT = "JDTENSOR_DEADLOCK_TIMEOUT"
# The stall time-out learnt from the run (on by default), and the floor it
# never goes below; JDTENSOR_STALL_TIMEOUT is its ceiling.
JDTENSOR_STALL_LEARN = "JDTENSOR_STALL_LEARN"
JDTENSOR_STALL_FLOOR = "JDTENSOR_STALL_FLOOR"
# A client the others wait for in collectives more than this share (percent)
# of the last JDTENSOR_STRAGGLER_WINDOW seconds is named a straggler (logged,
# never killed); 0 switches it off.
JDTENSOR_STRAGGLER_THRESHOLD = "JDTENSOR_STRAGGLER_THRESHOLD"
JDTENSOR_STRAGGLER_WINDOW = "JDTENSOR_STRAGGLER_WINDOW"
# Set by `jdtensor launch` for its clients: where a client that stops because
# of another writes whom it blames (the launcher names the root cause).
JDTENSOR_REPORT_DIR = "JDTENSOR_REPORT_DIR"
# Where each client writes its trace of the run (`jdtensor._trace`): set by
# `jdtensor launch --trace FILE`, or by hand under an engine.
JDTENSOR_TRACE_DIR = "JDTENSOR_TRACE_DIR"
# The run's shared secret: the start-up handshake authenticates every client
# with it (`jdtensor launch` makes one per run).
JDTENSOR_RUN_SECRET = "JDTENSOR_RUN_SECRET"
# How to find the cluster when DTENSOR_* is unset (see `jdtensor.cluster`).
JDTENSOR_CLUSTER_DETECTION = "JDTENSOR_CLUSTER_DETECTION"
# A TPU slice simulated on CPU devices, "XxYxZxC" (see `SimulatedTopology`).
JDTENSOR_SIMULATED_TPU_TOPOLOGY = "JDTENSOR_SIMULATED_TPU_TOPOLOGY"
# Kubernetes detection (`jdtensor.cluster`): what a Job or JobSet manifest
# tells its pods that Kubernetes itself does not.
JDTENSOR_K8S_PODS_PER_JOB = "JDTENSOR_K8S_PODS_PER_JOB"
JDTENSOR_K8S_NUM_JOBS = "JDTENSOR_K8S_NUM_JOBS"
JDTENSOR_K8S_SUBDOMAIN = "JDTENSOR_K8S_SUBDOMAIN"
JDTENSOR_K8S_JOB_NAME = "JDTENSOR_K8S_JOB_NAME"
# Set by `jdtensor launch --max-restarts` for its clients: 0 on the first
# attempt, then 1, 2, ...
JDTENSOR_RESTART_COUNT = "JDTENSOR_RESTART_COUNT"
# Read by `jdtensor launch --max-restarts`: false turns off the compilation
# cache its attempts share (as --no-compile-cache does).
JDTENSOR_COMPILE_CACHE = "JDTENSOR_COMPILE_CACHE"
# JAX's persistent compilation cache, as JAX reads it from the environment.
JAX_COMPILATION_CACHE_DIR = "JAX_COMPILATION_CACHE_DIR"
JAX_ENABLE_COMPILATION_CACHE = "JAX_ENABLE_COMPILATION_CACHE"
JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
# Set by jdtensor in an initialised client's own environment ("<pid>
# <client id> <coordinator>"): a child process that inherits it with the
# same DTENSOR_* is refused at once instead of fighting its parent.
JDTENSOR_CLIENT_PROCESS = "JDTENSOR_CLIENT_PROCESS"
# Set by `jdtensor launch` for its clients: this client's index on its node
# (0..), and how many clients its node runs (torchrun's LOCAL_RANK and
# LOCAL_WORLD_SIZE).
JDTENSOR_LOCAL_CLIENT_ID = "JDTENSOR_LOCAL_CLIENT_ID"
JDTENSOR_LOCAL_NUM_CLIENTS = "JDTENSOR_LOCAL_NUM_CLIENTS"
# Lets several clients of a GPU run use one GPU (refused at start-up
# otherwise: NCCL fails their first cross-client collective); for runs that
# never need one, such as tests of the heartbeat on a one-GPU machine.
JDTENSOR_SHARE_GPUS = "JDTENSOR_SHARE_GPUS"

# JAX's own variables that jdtensor reads (never writes).
JAX_NUM_CPU_DEVICES = "JAX_NUM_CPU_DEVICES"
JAX_PLATFORMS = "JAX_PLATFORMS"
XLA_FLAGS = "XLA_FLAGS"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# JAX's GPU memory share: the one JAX variable jdtensor may write, for
# clients that share a GPU (JDTENSOR_SHARE_GPUS), when the user set none of
# XLA_PYTHON_CLIENT_MEM_SETTINGS.
XLA_PYTHON_CLIENT_MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
# Every variable by which a user chooses JAX's GPU memory use.
XLA_PYTHON_CLIENT_MEM_SETTINGS = (XLA_PYTHON_CLIENT_MEM_FRACTION, "XLA_CLIENT_MEM_FRACTION",
                                  "XLA_PYTHON_CLIENT_PREALLOCATE",
                                  "XLA_PYTHON_CLIENT_ALLOCATOR")
# The user's private runtime directory (freedesktop): `jdtensor status`'s runs.
XDG_RUNTIME_DIR = "XDG_RUNTIME_DIR"
