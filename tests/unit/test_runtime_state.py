"""The runtime's state as an object (`jdtensor.runtime.Runtime`): tests build
their own, as JAX's tests build `distributed.State()`; none of this starts a
backend or touches the process's default runtime."""

import pytest

from jdtensor import runtime
from jdtensor.errors import NotInitializedError, PeerFailureError


def test_a_new_runtime_is_uninitialised_and_separate_from_the_default():
  rt = runtime.Runtime()
  assert rt is not runtime.default()
  assert not rt.is_initialized() and rt.cluster() is None
  rt.check_health()  # Nothing recorded: no error.
  with pytest.raises(NotInitializedError) as e:
    rt.shutdown()
  assert str(e.value) == ("Accelerator system is not initialized. Call "
                          "tf.experimental.dtensor.initialize_accelerator_system first.")


def test_the_first_peer_failure_is_kept_and_raised():
  rt = runtime.Runtime()
  first = PeerFailureError("heartbeat: client 1 missed beat 3", (1,))
  rt.record_peer_failure(first)
  rt.record_peer_failure(PeerFailureError("later", (2,)))
  with pytest.raises(PeerFailureError) as e:
    rt.check_health()
  assert e.value is first
  runtime.check_health()  # The default runtime heard nothing of it.


def test_tpu_mesh_names_and_registry_belong_to_their_runtime():
  a, b = runtime.Runtime(), runtime.Runtime()
  assert [a.next_auto_mesh_name() for _ in range(2)] == ["mesh_0", "mesh_1"]
  assert b.next_auto_mesh_name() == "mesh_0"  # The same on every client.
  a.register_tpu_mesh("m", ["d0", "d1"])
  assert a.registered_tpu_mesh_devices("m") == ["d0", "d1"]
  assert b.registered_tpu_mesh_devices("m") is None
  with pytest.raises(ValueError, match="^Mesh name already in use: m$"):
    a.register_tpu_mesh("m", [])
