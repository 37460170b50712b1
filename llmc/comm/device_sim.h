// Test hook LLMC_SIM_DEVICE=1: the device-resident communication paths, run and checked on the CPU.
//
// The code that moves tensors over a communicator chooses by where the communicator reads
// (Comm::on_device) and where the backend's memory is (Ops::host_memory): NCCL over CUDA memory
// takes the tensors themselves, MPI over CUDA memory stages them through host copies, MPI over
// the CPU backend takes them in place. Without a GPU only the last runs. With the hook:
//  - the CPU backend reports device memory (host_memory() false) and records what it allocates;
//  - parallel.comm "nccl" is accepted on device "cpu": every group that NCCL would carry is an MPI
//    communicator that reports on_device() and runs_in_order() and checks that every float buffer
//    it is given lies inside one allocation of the backend (a host buffer ends the run with the
//    call and the group named, as NCCL's own check does on a GPU);
//  - parallel.comm "mpi" then runs the MPI-with-CUDA paths: every tensor staged through the host.
// The numbers are those of a run without the hook, bit for bit (test/e2e/test_device_comm.sh):
// only the route of the bytes changes.
#pragma once
#include <cstddef>
#include <memory>

#include "llmc/comm/comm.h"

// LLMC_SIM_DEVICE is "1" (read once; any value other than unset, "" or "0"/"1" throws UserError).
bool sim_device();
// The CPU backend's allocations while the hook is on.
void sim_device_register(const void* p, size_t bytes);
void sim_device_unregister(const void* p);
// [p, p + bytes) lies inside one registered allocation.
bool sim_device_owns(const void* p, size_t bytes);
// inner: a host communicator (MPI, or the group of one); the result reads "device" memory only.
std::unique_ptr<Comm> make_device_check_comm(std::unique_ptr<Comm> inner);
