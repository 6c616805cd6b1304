/* The C API of layout switching (libptcfs_switch.so): what a training job in
 * any framework calls to move its parameters and gradients from one parallel
 * layout to another (python/ptcfs_switch.py wraps it with ctypes).
 *
 * A plan is made once per (layout A, layout B) and cached inside the library;
 * each rank then runs its part with its buffers' addresses, in the order
 * ptcfs_switch_describe lists them, either
 *   - on the CPU with the caller's transport (ptcfs_switch_run and an
 *     exchange callback, e.g. torch.distributed isend/irecv over gloo), or
 *     every rank as a thread of this process (ptcfs_switch_run_threads); or
 *   - on a GPU (ptcfs_switch_run_cuda) on the caller's CUDA stream with an
 *     NCCL communicator over the plan's ranks (only in a library built with
 *     CUDA and NCCL; ptcfs_switch_has_cuda says which).
 *
 * Every function returning int returns 0 on success and -1 on failure, and
 * then ptcfs_switch_last_error() (per thread) says why, naming the layout,
 * tensor or buffer at fault. Functions returning a pointer return NULL on
 * failure. Thread safety: plans are immutable and may be shared between
 * threads; run functions for different ranks may run concurrently.
 */
#ifndef PTCFS_SWITCH_C_API_H_
#define PTCFS_SWITCH_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(PTCFS_SWITCH_EXPORTS)
#define PTCFS_SWITCH_API __attribute__((visibility("default")))
#else
#define PTCFS_SWITCH_API
#endif

typedef struct ptcfs_switch_plan ptcfs_switch_plan;

/* Exchanges one bucket's messages: sends nsend buffers to send_peers and
 * receives nrecv into recv_data, as one group (post them all, then wait).
 * Returns 0, or non-zero to abort the switch. */
typedef int (*ptcfs_switch_exchange_fn)(void* ctx, int nsend, const int* send_peers, const void* const* send_data,
                                        const uint64_t* send_bytes, int nrecv, const int* recv_peers,
                                        void* const* recv_data, const uint64_t* recv_bytes);

/* Plans the switch of `schema` (a built-in name or a JSON file) with model
 * `dims` ("layers=32,hidden=4096,...") from config `from` to config `to`
 * ("tp=2,pp=2,dp=2[,zero=1][,pp_layers=...]"). `options`, may be NULL or "":
 * "param_dtype=bf16,grad_dtype=bf16,grads=1,optimizer=0,ranks_per_host=8,budget=67108864". */
PTCFS_SWITCH_API ptcfs_switch_plan* ptcfs_switch_plan_create(const char* schema, const char* dims, const char* from, const char* to,
                                            const char* options);
PTCFS_SWITCH_API void ptcfs_switch_free(ptcfs_switch_plan* plan);

PTCFS_SWITCH_API int ptcfs_switch_world(const ptcfs_switch_plan* plan);
/* JSON of rank's part (rank >= 0): buffers "from" and "to" (name, dtype,
 * shape, bytes, and segments: global tensor, box begin/end, offset and
 * strides in elements), staging_bytes, buckets, bytes sent and received; or
 * of the whole plan (rank < 0): world, buckets, bytes, and "tensors" (global
 * name -> shape). Valid until the next call on this thread. */
PTCFS_SWITCH_API const char* ptcfs_switch_describe(const ptcfs_switch_plan* plan, int rank);

/* Fills rank's buffers of one side (0: layout A, 1: layout B) with the
 * synthetic values of ptcfs synth (seed), padding untouched: examples and tests. */
PTCFS_SWITCH_API int ptcfs_switch_synth(const ptcfs_switch_plan* plan, int rank, int side, uint64_t seed, void* const* buffers);

/* Host memory. from[i] / to[i]: rank's buffers in the order of describe. */
PTCFS_SWITCH_API int ptcfs_switch_run(const ptcfs_switch_plan* plan, int rank, const void* const* from, void* const* to,
                     ptcfs_switch_exchange_fn exchange, void* ctx);
/* Every rank as a thread: from[r][i], to[r][i]. */
PTCFS_SWITCH_API int ptcfs_switch_run_threads(const ptcfs_switch_plan* plan, const void* const* const* from, void* const* const* to);

PTCFS_SWITCH_API int ptcfs_switch_has_cuda(void);
/* Device memory, on `stream` (a cudaStream_t; NULL: the default stream),
 * messages over `comm` (an ncclComm_t whose ranks are the plan's). Returns
 * when the work is queued on the stream. */
PTCFS_SWITCH_API int ptcfs_switch_run_cuda(const ptcfs_switch_plan* plan, int rank, const void* const* from, void* const* to,
                          void* stream, void* comm);
/* NCCL bootstrap for callers without one: a unique id (128 bytes) on one
 * rank, shared by the caller (e.g. torch.distributed.broadcast), then a
 * communicator on each rank (current CUDA device). */
PTCFS_SWITCH_API int ptcfs_switch_nccl_unique_id(char id[128]);
PTCFS_SWITCH_API int ptcfs_switch_nccl_comm_create(const char id[128], int world, int rank, void** comm);
PTCFS_SWITCH_API int ptcfs_switch_nccl_comm_destroy(void* comm);

PTCFS_SWITCH_API const char* ptcfs_switch_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* PTCFS_SWITCH_C_API_H_ */
