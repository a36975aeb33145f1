"""DTENSOR_* from TPU pod / SLURM / Open MPI environments (fake environments)."""

import pytest

from jdtensor import cluster
from jdtensor.errors import ConfigError

TPU = {"TPU_WORKER_HOSTNAMES": "t1v-0,t1v-1,t1v-2,t1v-3", "TPU_WORKER_ID": "2"}
SLURM = {"SLURM_JOB_ID": "4100", "SLURM_STEP_NODELIST": "node[01-02],gpu7",
         "SLURM_NTASKS": "5", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
         "SLURM_STEP_TASKS_PER_NODE": "2(x2),1"}
OMPI = {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911",
        "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1"}


def test_tpu_pod():
  found = cluster.detect(TPU)
  assert found == cluster.DetectedCluster(
      "tpu", ("t1v-0:8482", "t1v-1:8482", "t1v-2:8482", "t1v-3:8482"), 2)
  assert cluster.detect({**TPU, "JAX_COORDINATOR_PORT": "9000"}).jobs[0] == "t1v-0:9000"
  assert cluster.resolve(TPU, "auto") == {
      "DTENSOR_JOBS": "t1v-0:8482,t1v-1:8482,t1v-2:8482,t1v-3:8482",
      "DTENSOR_CLIENT_ID": "2"}


def test_slurm():
  found = cluster.detect(SLURM, "slurm")
  port = 61440 + 4100 % 4096
  assert found.jobs == (f"node01:{port}", f"node01:{port + 1}", f"node02:{port}",
                        f"node02:{port + 1}", f"gpu7:{port}")
  assert found.client_id == 3
  assert cluster.expand_hostlist("n[1-3,10],x,y[08-09]") == [
      "n1", "n2", "n3", "n10", "x", "y08", "y09"]


def test_ompi():
  found = cluster.detect(OMPI)
  port = (1531576320 // 4096) % 4096 + 65535 - 4096 + 1
  assert found == cluster.DetectedCluster(
      "ompi", (f"10.96.0.1:{port}", f"10.96.0.1:{port + 1}", f"10.96.0.1:{port + 2}"), 1)


def test_nothing_detected():
  assert cluster.detect({}) is None
  assert cluster.resolve({}, "auto") == {}
  assert cluster.resolve(TPU) == {}  # Default method: none (DTensor semantics).
  assert cluster.resolve({**TPU, "JDTENSOR_CLUSTER_DETECTION": "tpu"}) != {}
  with pytest.raises(ConfigError, match=r"^cluster_detection='slurm': this process "
                     "is not part of a slurm cluster"):
    cluster.resolve(TPU, "slurm")
  with pytest.raises(ConfigError, match="cluster_detection='pbs' is not one of"):
    cluster.resolve({}, "pbs")


def test_user_dtensor_vars_win_and_disagreement_is_an_error():
  same = {**TPU, "DTENSOR_JOBS": "a:1,b:1,c:1,d:1", "DTENSOR_CLIENT_ID": "2"}
  assert cluster.resolve(same, "auto") == {}  # Never overrides.
  with pytest.raises(ConfigError) as e:
    cluster.resolve({**TPU, "DTENSOR_JOBS": "a:1,b:1"}, "auto")
  assert str(e.value) == (
      "DTENSOR_JOBS='a:1,b:1' (client 0) disagrees with the tpu cluster (4 "
      "clients, this is client 2). Unset DTENSOR_JOBS/DTENSOR_CLIENT_ID to use the "
      "cluster's, or turn cluster detection off.")
  with pytest.raises(ConfigError, match="DTENSOR_CLIENT_ID='1' disagrees with the "
                     "tpu cluster, where this process is client 2."):
    cluster.resolve({**TPU, "DTENSOR_CLIENT_ID": "1"}, "auto")
  # Only the missing variable is filled in.
  assert cluster.resolve({**TPU, "DTENSOR_CLIENT_ID": "2"}, "auto") == {
      "DTENSOR_JOBS": "t1v-0:8482,t1v-1:8482,t1v-2:8482,t1v-3:8482"}


@pytest.mark.parametrize("env,fragment", [
    ({**TPU, "TPU_WORKER_ID": "x"}, "TPU_WORKER_ID='x' is not an integer"),
    ({**TPU, "TPU_WORKER_HOSTNAMES": "a,,b"}, "has an empty entry"),
    ({**TPU, "TPU_WORKER_ID": "7"},
     "Environment variable DTENSOR_CLIENT_ID must be < 4, got 7"),
    ({**SLURM, "SLURM_NTASKS": "4"}, "SLURM_NTASKS=4 but the tasks per node"),
    ({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "2(x9)"}, "lists 9 nodes"),
    ({**SLURM, "SLURM_STEP_NODELIST": "n[a-b]"}, "has a bad range 'a-b'"),
    ({**OMPI, "OMPI_MCA_orte_hnp_uri": "garbage"}, "does not name the mpirun host"),
    ({**TPU, "JAX_COORDINATOR_PORT": "99999"}, "JAX_COORDINATOR_PORT='99999'"),
])
def test_malformed_cluster_variables(env, fragment):
  with pytest.raises(ConfigError) as e:
    cluster.resolve(env, "auto")
  assert fragment in str(e.value)
