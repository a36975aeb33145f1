"""A simulated TPU slice on CPU: 2x4 chips of 2 cores, 2 hosts of 8 cores.

Each client's 8 CPU devices are its host's TPU cores; the core-id merge runs
for real (a psum over every device) and the mesh is ring-ordered with
DTensor's algorithm.

Run: JDTENSOR_SIMULATED_TPU_TOPOLOGY=2x4x1x2 jdtensor launch -n 2 --devices-per-client 8 -- python tpu_simulated.py
Expect: [client 1] two_host1|batch=2,model=8|0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15|8,9,10,11,14,15,12,13|/job:worker/replica:0/task:1/device:TPU:0,
Expect: [client 1] this client's first devices on the mesh: [{'batch': 1, 'model': 0}, {'batch': 1, 'model': 1}]
"""
import jdtensor

jdtensor.initialize_accelerator_system("TPU")
mesh = jdtensor.create_tpu_mesh(["batch", "model"], [2, 8], "two_host1")
print(mesh.to_string())
print("this client's first devices on the mesh:", jdtensor.get_device_locations(mesh)[:2])
