"""Every function TF 2.21's tf.experimental.dtensor exports takes the same
parameters in jdtensor: names, order, kinds and defaults.

The table is copied from ../shared/reference/tf_dtensor_api.md (made with
inspect.signature from tensorflow-cpu 2.21.0), annotations dropped. Names TF
has and jdtensor does not are listed, with the reason, in
docs/guides/from_tf_dtensor.md ("API: DTensor -> jdtensor -> plain JAX").
"""

import inspect

import pytest

import jdtensor

# name -> TF 2.21's parameters.
TF_221 = {
    "Layout": "sharding_specs, mesh",
    "Mesh": "dim_names, global_device_ids, local_device_ids, local_devices, "
            "mesh_name='', global_devices=None, use_xla_spmd=False",
    "barrier": "mesh, barrier_name=None, timeout_in_ms=None",
    "call_with_layout": "fn, layout, *args, **kwargs",
    "check_layout": "tensor, layout",
    "client_id": "",
    "copy_to_mesh": "tensor, layout, source_layout=None",
    "create_distributed_mesh": "mesh_dims, mesh_name='', local_devices=None, "
                               "device_type=None, use_xla_spmd=False",
    "create_mesh": "mesh_dims=None, mesh_name='', devices=None, device_type=None, "
                   "use_xla_spmd=False",
    "create_tpu_mesh": "mesh_dim_names, mesh_shape, mesh_name, ring_dims=None, "
                       "ring_axes=None, ring_bounds=None, "
                       "can_split_host_across_rings=True, "
                       "build_ring_across_rings=False, "
                       "rotate_ring_across_rings=False, use_xla_spmd=False",
    "default_mesh": "mesh",
    "device_name": "",
    "fetch_layout": "tensor",
    "full_job_name": "task_id=None",
    "get_default_mesh": "",
    "heartbeat_enabled": "",
    "initialize_accelerator_system": "device_type=None, "
                                     "enable_coordination_service=True, "
                                     "num_logical_cpu_devices=None, "
                                     "experimental_reset_context=False, "
                                     "experimental_enable_megcore=False",
    "initialize_multi_client": "device_type=None, enable_coordination_service=True, "
                               "num_logical_cpu_devices=None, "
                               "experimental_reset_context=False, "
                               "experimental_enable_megcore=False",
    "initialize_tpu_system": "device_type=None, enable_coordination_service=True, "
                             "num_logical_cpu_devices=None, "
                             "experimental_reset_context=False, "
                             "experimental_enable_megcore=False",
    "is_dtensor": "tensor",
    "job_name": "",
    "jobs": "",
    "local_devices": "device_type, for_client_id=None",
    "num_clients": "",
    "num_global_devices": "device_type",
    "num_local_devices": "device_type",
    "pack": "tensors, layout",
    "preferred_device_type": "",
    "relayout": "tensor, layout, name=None",
    "relayout_like": "tensor, layout_tensor, name=None",
    "run_on": "mesh",
    "shutdown_accelerator_system": "",
    "shutdown_tpu_system": "",
    "unpack": "tensor",
}

# TF names jdtensor does not provide (docs/guides/from_tf_dtensor.md says why): TF graph and
# checkpoint machinery with no JAX counterpart.
ABSENT = {"DTensorCheckpoint", "DTensorDataset", "DVariable", "enable_save_as_bf16",
          "name_based_restore", "name_based_save", "sharded_save"}


def tf_parameters(text):
  out = []
  for part in filter(None, (p.strip() for p in text.split(","))):
    if part.startswith("**"):
      out.append((part[2:], inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty))
    elif part.startswith("*"):
      out.append((part[1:], inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.empty))
    else:
      name, eq, default = part.partition("=")
      out.append((name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  eval(default) if eq else inspect.Parameter.empty))  # noqa: S307
  return out


@pytest.mark.parametrize("name", sorted(TF_221))
def test_parameters_match_tf_2_21(name):
  obj = getattr(jdtensor, name)
  sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
  params = [p for p in sig.parameters.values() if p.name != "self"]
  want = tf_parameters(TF_221[name])
  got = [(p.name, p.kind, p.default) for p in params[:len(want)]]
  assert got == want, (name, sig)
  # Anything jdtensor adds comes after TF's parameters, keyword-only, with a
  # default: code written for TF never sees it.
  for extra in params[len(want):]:
    assert extra.kind == inspect.Parameter.KEYWORD_ONLY, (name, extra)
    assert extra.default is not inspect.Parameter.empty, (name, extra)


# Every public name of TF 2.21's tf.experimental.dtensor (the reference).
TF_221_NAMES = {
    "DTensorCheckpoint", "DTensorDataset", "DVariable", "Layout", "MATCH", "Mesh",
    "UNSHARDED", "barrier", "call_with_layout", "check_layout", "client_id",
    "copy_to_mesh", "create_distributed_mesh", "create_mesh", "create_tpu_mesh",
    "default_mesh", "device_name", "enable_save_as_bf16", "fetch_layout",
    "full_job_name", "get_default_mesh", "heartbeat_enabled",
    "initialize_accelerator_system", "initialize_multi_client",
    "initialize_tpu_system", "is_dtensor", "job_name", "jobs", "local_devices",
    "name_based_restore", "name_based_save", "num_clients", "num_global_devices",
    "num_local_devices", "pack", "preferred_device_type", "relayout",
    "relayout_like", "run_on", "sharded_save", "shutdown_accelerator_system",
    "shutdown_tpu_system", "unpack"}


def test_every_tf_name_is_present_or_listed_as_absent():
  assert TF_221_NAMES == set(TF_221) | ABSENT | {"MATCH", "UNSHARDED"}
  assert not ABSENT & set(jdtensor.__all__)
  for name in set(TF_221) | {"MATCH", "UNSHARDED"}:
    assert name in jdtensor.__all__, name


def test_the_docs_list_every_absent_name_with_a_reason():
  import pathlib
  page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "guides"
            / "from_tf_dtensor.md").read_text()
  for name in ABSENT:
    assert f"`{name}`" in page, name
