"""Every environment variable jdtensor reads, parsed strictly.

The package: `names` spells every variable once; `parse` holds the strict
parsers of one value; `cluster_env` the cluster (``DTENSOR_JOBS`` and who this
client is); `runtime_env` the runtime's knobs (time-outs, addresses, device
counts); `heartbeat_env` the heartbeat's settings. Import from here
(``from jdtensor import _env``): this module re-exports them all.

PURE: standard library only. Never imports jax, never starts a backend.

Each reader takes the environment as a mapping (default: ``os.environ``), so
tests pass a dict instead of patching the process environment, and callers
read the environment at call time, as TF DTensor does (users commonly set
``DTENSOR_*`` in-process before initialising).

Differences from TF DTensor 2.21 (deliberate fixes, see docs/guides/from_tf_dtensor.md):

* ``DTENSOR_JOBS`` entries are stripped; empty entries and entries that are
  not ``host:port`` (port 1..65535) or a ``/bns/`` address are rejected, as are
  duplicates. An empty or blank value means local mode (TF master behaviour;
  2.21 turned ``""`` into one job named ``''``).
* ``DTENSOR_CLIENT_ID`` must be a decimal integer; anything else is a
  `ConfigError` naming the variable (TF: a bare ``int()`` error).
* Boolean variables accept true/false/1/0/yes/no in any case and reject
  anything else (TF: ``"yes"`` is False, and ``"false"`` is True for the
  ``!= "0"`` variables).
* The legacy ``DTENSOR_NUM_CLIENTS`` is read again; when it disagrees with
  ``DTENSOR_JOBS`` a `ConfigError` names both (TF 2.11+ ignores it silently).
* An unsorted mix of numeric and non-numeric BNS task ids is a `ConfigError`
  (TF: a raw ``TypeError`` from ``sorted``).
"""

from __future__ import annotations

from jdtensor._env.names import (DTENSOR_CLIENT_ID, DTENSOR_JOBS, DTENSOR_JOB_NAME,
                                 DTENSOR_NUM_CLIENTS, DTENSOR_ENABLE_HEARTBEAT,
                                 DTENSOR_GPU_USE_NCCL_COMMUNICATION,
                                 DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION,
                                 JDTENSOR_INIT_TIMEOUT, JDTENSOR_COORDINATION_TIMEOUT,
                                 JDTENSOR_HEARTBEAT_TIMEOUT, JDTENSOR_SHUTDOWN_TIMEOUT,
                                 JDTENSOR_COORDINATOR_BIND_ADDRESS,
                                 JDTENSOR_HEARTBEAT_PERIOD, JDTENSOR_HEARTBEAT_POLICY,
                                 JDTENSOR_STUCK_TIMEOUT, JDTENSOR_STALL_TIMEOUT,
                                 JDTENSOR_STALL_LEARN, JDTENSOR_STALL_FLOOR,
                                 JDTENSOR_STALL_KILL_ALL_WAITING, JDTENSOR_DEADLOCK_TIMEOUT,
                                 JDTENSOR_REPORT_DIR,
                                 JDTENSOR_TRACE_DIR,
                                 JDTENSOR_STRAGGLER_THRESHOLD, JDTENSOR_STRAGGLER_WINDOW,
                                 JDTENSOR_RUN_SECRET, JDTENSOR_CLUSTER_DETECTION,
                                 JDTENSOR_SIMULATED_TPU_TOPOLOGY,
                                 JDTENSOR_K8S_PODS_PER_JOB, JDTENSOR_K8S_NUM_JOBS,
                                 JDTENSOR_K8S_SUBDOMAIN, JDTENSOR_K8S_JOB_NAME,
                                 JDTENSOR_RESTART_COUNT, JDTENSOR_CLIENT_PROCESS, JAX_NUM_CPU_DEVICES, JAX_PLATFORMS,
                                 JDTENSOR_COMPILE_CACHE, JAX_COMPILATION_CACHE_DIR,
                                 JAX_ENABLE_COMPILATION_CACHE,
                                 JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS,
                                 JDTENSOR_LOCAL_CLIENT_ID, JDTENSOR_LOCAL_NUM_CLIENTS,
                                 CUDA_VISIBLE_DEVICES, JDTENSOR_SHARE_GPUS,
                                 XLA_PYTHON_CLIENT_MEM_FRACTION,
                                 XLA_PYTHON_CLIENT_MEM_SETTINGS)
from jdtensor._env.parse import (MAX_TIMEOUT, parse_host, parse_port,
                                 parse_bind_address, parse_timeout, parse_bool,
                                 parse_int, read_bool, process_environ)
from jdtensor._env.cluster_env import (normalize_address, read_run_secret, ClusterEnv,
                                       run_secret_hint,
                                       detection_method,
                                       parse_jobs, jobs, num_clients, client_id,
                                       job_name, read_cluster_env,
                                       read_legacy_num_clients, read_seed_job_name)
from jdtensor._env.runtime_env import (Timeouts, read_timeouts, read_bind_override,
                                       read_cpu_device_count, cpu_device_count_setting,
                                       resolve_cpu_device_count,
                                       without_cpu_device_count, read_report_dir,
                                       read_trace_dir,
                                       read_restart_count, read_user_runtime_dir,
                                       read_inherited_client, mark_client_process,
                                       read_visible_gpu_limit, read_simulated_tpu_shape,
                                       read_jax_platforms, PLATFORM_DEVICE_TYPES,
                                       read_visible_gpus, fit_shared_gpu_memory,
                                       JAX_DEFAULT_MEM_FRACTION)
from jdtensor._env.heartbeat_env import (HEARTBEAT_POLICIES, HeartbeatSettings,
                                         STUCK_SHARE_OF_COORDINATION,
                                         read_heartbeat_and_coordination,
                                         read_heartbeat_settings, settle_timeouts)

__all__ = [
    "run_secret_hint",
    "DTENSOR_CLIENT_ID",
    "DTENSOR_JOBS",
    "DTENSOR_JOB_NAME",
    "DTENSOR_NUM_CLIENTS",
    "DTENSOR_ENABLE_HEARTBEAT",
    "DTENSOR_GPU_USE_NCCL_COMMUNICATION",
    "DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION",
    "JDTENSOR_INIT_TIMEOUT",
    "JDTENSOR_COORDINATION_TIMEOUT",
    "JDTENSOR_HEARTBEAT_TIMEOUT",
    "JDTENSOR_SHUTDOWN_TIMEOUT",
    "JDTENSOR_COORDINATOR_BIND_ADDRESS",
    "JDTENSOR_HEARTBEAT_PERIOD",
    "JDTENSOR_HEARTBEAT_POLICY",
    "JDTENSOR_STUCK_TIMEOUT",
    "JDTENSOR_STALL_TIMEOUT",
    "JDTENSOR_STALL_LEARN",
    "JDTENSOR_STALL_FLOOR",
    "JDTENSOR_STALL_KILL_ALL_WAITING",
    "JDTENSOR_DEADLOCK_TIMEOUT",
    "JDTENSOR_STRAGGLER_THRESHOLD",
    "JDTENSOR_STRAGGLER_WINDOW",
    "JDTENSOR_REPORT_DIR",
    "JDTENSOR_TRACE_DIR",
    "JDTENSOR_RUN_SECRET",
    "JDTENSOR_CLUSTER_DETECTION",
    "JDTENSOR_SIMULATED_TPU_TOPOLOGY",
    "JDTENSOR_K8S_PODS_PER_JOB",
    "JDTENSOR_K8S_NUM_JOBS",
    "JDTENSOR_K8S_SUBDOMAIN",
    "JDTENSOR_K8S_JOB_NAME",
    "JDTENSOR_RESTART_COUNT",
    "JDTENSOR_CLIENT_PROCESS",
    "read_inherited_client",
    "mark_client_process",
    "JAX_NUM_CPU_DEVICES",
    "JAX_PLATFORMS",
    "JDTENSOR_COMPILE_CACHE",
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_ENABLE_COMPILATION_CACHE",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JDTENSOR_LOCAL_CLIENT_ID",
    "JDTENSOR_LOCAL_NUM_CLIENTS",
    "CUDA_VISIBLE_DEVICES",
    "JDTENSOR_SHARE_GPUS",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_MEM_SETTINGS",
    "MAX_TIMEOUT",
    "parse_host",
    "parse_port",
    "normalize_address",
    "parse_bind_address",
    "parse_timeout",
    "read_run_secret",
    "detection_method",
    "HEARTBEAT_POLICIES",
    "HeartbeatSettings",
    "read_heartbeat_settings",
    "read_heartbeat_and_coordination",
    "settle_timeouts",
    "STUCK_SHARE_OF_COORDINATION",
    "ClusterEnv",
    "parse_bool",
    "parse_int",
    "parse_jobs",
    "jobs",
    "num_clients",
    "client_id",
    "job_name",
    "read_bool",
    "read_cluster_env",
    "Timeouts",
    "read_timeouts",
    "read_bind_override",
    "read_cpu_device_count",
    "process_environ",
    "cpu_device_count_setting",
    "resolve_cpu_device_count",
    "without_cpu_device_count",
    "read_report_dir",
    "read_trace_dir",
    "read_restart_count",
    "read_user_runtime_dir",
    "read_legacy_num_clients",
    "read_seed_job_name",
    "read_visible_gpu_limit",
    "read_visible_gpus",
    "read_jax_platforms",
    "PLATFORM_DEVICE_TYPES",
    "read_simulated_tpu_shape",
    "fit_shared_gpu_memory",
    "JAX_DEFAULT_MEM_FRACTION",
]
