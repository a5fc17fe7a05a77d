/* The 11 NCCL functions that torch 2.14.0's libtorch_cuda.so links against and NCCL 2.28.9 (the GPU host's,
 * installed with torch 2.11.0) does not have. Preloaded (LD_PRELOAD) they let torch 2.14 load on the host's
 * NCCL instead of carrying NCCL 2.30.7 (172 MiB compressed, three transfers). Each answers
 * ncclInvalidUsage: they serve communicator grow/suspend/resume, memory statistics and device-side
 * signalling, none of which a single-GPU vLLM engine calls; the probe (probe_torch.py) checks that a
 * one-rank NCCL all-reduce still works with it.
 *
 * Found with bench/gpu/check_symbols.sh (torch 2.14.0 against nvidia-nccl-cu13 2.28.9).
 * Build: gcc -shared -fPIC -O2 -o libnccl_compat.so nccl_compat.c (build_bundle.sh does it).
 */
typedef int ncclResult_t;
#define NCCL_INVALID_USAGE 5
#define NOT_IN_THIS_NCCL(name) \
  ncclResult_t name(void) { return NCCL_INVALID_USAGE; }

NOT_IN_THIS_NCCL(ncclCommGetUniqueId)
NOT_IN_THIS_NCCL(ncclCommGrow)
NOT_IN_THIS_NCCL(ncclCommMemStats)
NOT_IN_THIS_NCCL(ncclCommResume)
NOT_IN_THIS_NCCL(ncclCommSuspend)
NOT_IN_THIS_NCCL(ncclGetLsaMultimemDevicePointer)
NOT_IN_THIS_NCCL(ncclGetPeerDevicePointer)
NOT_IN_THIS_NCCL(ncclPutSignal)
NOT_IN_THIS_NCCL(ncclSignal)
NOT_IN_THIS_NCCL(ncclWaitSignal)
NOT_IN_THIS_NCCL(ncclWinGetUserPtr)
