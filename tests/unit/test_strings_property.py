"""Property tests for the mesh and layout string formats."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jdtensor import UNSHARDED, Layout, Mesh

_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=6
                 ).filter(lambda s: s not in ("any", "match", "unsharded", "scalar"))


@st.composite
def meshes(draw):
  names = draw(st.lists(_NAMES, min_size=1, max_size=3, unique=True))
  shape = draw(st.lists(st.integers(1, 3), min_size=len(names), max_size=len(names)))
  size = int(np.prod(shape))
  clients = draw(st.sampled_from([c for c in (1, 2, 3) if size % c == 0]))
  client = draw(st.integers(0, clients - 1))
  local = size // clients
  start = draw(st.integers(0, 4))
  device_type = draw(st.sampled_from(["CPU", "GPU", "TPU"]))
  job = draw(st.sampled_from(["localhost", "worker"]))
  devices = [f"/job:{job}/replica:0/task:{client}/device:{device_type}:{i}"
             for i in range(local)]
  global_ids = np.arange(start, start + size).reshape(shape)
  local_ids = list(range(start + client * local, start + (client + 1) * local))
  with_globals = draw(st.booleans())
  global_devices = [f"/job:{job}/replica:0/task:{i // local}/device:{device_type}:"
                    f"{i % local}" for i in range(size)] if with_globals else None
  return Mesh(names, global_ids, local_ids, devices,
              mesh_name=draw(st.sampled_from(["", "m", "mesh_1"])),
              global_devices=global_devices,
              use_xla_spmd=device_type == "TPU" and draw(st.booleans()))


@settings(max_examples=150, deadline=None)
@given(meshes())
def test_mesh_round_trip(mesh):
  s = mesh.to_string()
  assert Mesh.from_string(s) == mesh
  assert Mesh.from_string(s).to_string() == s


@settings(max_examples=150, deadline=None)
@given(meshes(), st.data())
def test_layout_round_trip(mesh, data):
  rank = data.draw(st.integers(0, 4))
  dims = data.draw(st.permutations(mesh.dim_names + [UNSHARDED] * rank))
  layout = Layout(list(dims[:rank]), mesh)
  assert Layout.from_string(layout.to_string()) == layout
  assert Layout.from_string(layout.to_string()).to_string() == layout.to_string()


_GARBAGE = st.text(alphabet="|,=:/* abcxyz0129-CPUTGjobtaskdevicereplica_",
                   max_size=80)


@settings(max_examples=400, deadline=None)
@given(_GARBAGE)
def test_mesh_garbage_only_value_error(s):
  try:
    Mesh.from_string(s)
  except ValueError:
    pass


@settings(max_examples=400, deadline=None)
@given(st.one_of(_GARBAGE, _GARBAGE.map(lambda s: "sharding_specs:" + s + " mesh:" +
                                      "|x=2|0,1|0,1|/job:a/task:0/device:CPU:0,"
                                      "/job:a/task:0/device:CPU:1")))
def test_layout_garbage_only_value_error(s):
  try:
    Layout.from_string(s)
  except ValueError:
    pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40).map(lambda b: b.decode("latin-1")))
def test_arbitrary_text_only_value_error(s):
  for parse in (Mesh.from_string, Layout.from_string):
    try:
      parse(s)
    except ValueError:
      pass
