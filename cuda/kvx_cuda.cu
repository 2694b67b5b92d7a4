/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvx_cuda.cu: the gather/scatter kernels and the C ABI of libkvxcuda.so (see kvx_cuda.h).
 *
 * How the kernels cut the work. A plan's stream is [layer][kv][block i][head][token][row]. We
 * call one (layer, kv, block i) triple a group: its bytes are heads x tokens x row, they sit
 * at one base address in the pool plus head and token strides, and every group has the same
 * size. A work item is a tile of one group: whole rounds of 256 threads x 4 vectors, as many
 * as leave each CTA about two items (plan_tiles), so the division of a stream position into
 * (layer, kv, block) is paid once per item, not per vector, and a small chunk still spreads
 * over many SMs. Items are taken grid-stride. Inside a group, kvx_run_units says how much is
 * contiguous, and a grid-uniform mode picks the cheapest index math: the whole group (no
 * division), one run per head (one), or one run per token row (two); all of it 32-bit.
 *
 * Vector width is the largest of 16/8/4/2/1 bytes that divides every address the math can
 * produce (pool base, buffer, offset, row, and each stride that is actually multiplied by a
 * non-zero index); the odd tail of a range is copied byte by byte. Copies are by bytes, so
 * element size only matters through the row size: FP8, BF16 and FP32 share one kernel.
 *
 * Why one file of about 650 lines: the kernels' templates, the launcher that instantiates
 * them and the C ABI around them form one translation unit, so every build of libkvxcuda.so
 * (CMake, `make cuda-check`, the GPU job) is one nvcc call with no relocatable device code,
 * and the ABI's runtime wrappers (memory, streams, events; about 150 lines) sit beside the
 * only code that uses the device they open.
 */
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "kvx_cuda.h"

namespace {

#define KVX_TRY(expr)                       \
  do {                                      \
    const cudaError_t kvx_err_ = (expr);    \
    if (kvx_err_ != cudaSuccess) return (int)kvx_err_; \
  } while (0)

// Unrolling is a device concern; the host compiler (emulation) would warn about the pragma.
#ifdef __CUDA_ARCH__
#define KVX_UNROLL _Pragma("unroll")
#else
#define KVX_UNROLL
// gcc cannot see that r[j] is stored only where it was loaded (same i < nvec test), and
// initialising r to silence it makes ptxas spill the 16-byte scatter kernel.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

constexpr int kThreads = 256;  // per CTA; 8 warps keeps tiles short and occupancy high
constexpr int kUnroll = 4;     // vectors in flight per thread: enough loads to cover latency
// CTAs per SM the kernels must fit: 4 x 256 threads x 4 x 16 B = 64 KiB of loads in flight per
// SM, well past what HBM latency needs. Saying so also lets ptxas use up to 64 registers; with
// a bare __launch_bounds__(256), ptxas 13.2 capped sm_80 at 48 and spilled.
constexpr int kMinCtasPerSM = 4;
constexpr int kMaxDevices = 64;

// How a group's bytes map onto the pool, from kvx_run_units.
enum RunMode : int {
  kWholeGroup = 0,  // the selected heads' tokens are one contiguous run
  kPerHead = 1,     // each head's tokens are contiguous, heads are strided
  kPerRow = 2,      // every token row stands alone
};

// Division by a divisor fixed for the whole launch, as a multiply-high and a shift
// (Granlund-Montgomery): with m = ceil(2^(31+l) / d), l = ceil(log2 d), floor(x / d) is
// (x * m) >> (32 + l - 1) exactly for every x < 2^31. A 32-bit division by a run-time value is
// about 20 instructions on the GPU; every vector of the per-row mode needs two, which this
// turns into a few. prepare() keeps every dividend below 2^31.
struct FastDiv {
  uint32_t d;    // the divisor, for the remainder
  uint32_t mul;  // 0 means d == 1
  uint32_t shr;
};

FastDiv make_fastdiv(uint32_t d) {
  FastDiv f{d, 0, 0};
  if (d <= 1) return f;
  uint32_t l = 0;
  while ((1ull << l) < d) l++;
  f.mul = (uint32_t)(((1ull << (31 + l)) + d - 1) / d);
  f.shr = l - 1;
  return f;
}

__host__ __device__ __forceinline__ uint32_t fdiv(const FastDiv &f, uint32_t x) {
  if (f.mul == 0) return x;
#ifdef __CUDA_ARCH__
  return __umulhi(x, f.mul) >> f.shr;
#else
  return (uint32_t)(((uint64_t)x * f.mul) >> 32) >> f.shr;
#endif
}

// Everything a kernel needs, passed by value (kernel parameter space), derived once on the host.
struct Args {
  const int32_t *__restrict__ blocks;
  const unsigned char *src_base;  // pool (gather) or buffer (scatter)
  unsigned char *dst_base;        // buffer (gather) or pool (scatter)
  int64_t nblocks;
  int64_t kv_factor;
  int64_t stride_block, stride_layer, stride_kv, stride_head, stride_token;
  int64_t base_fixed;   // layer_begin*stride_layer + head_begin*stride_head
  int64_t row;          // bytes per token row
  int64_t run;          // bytes per contiguous run (mode kPerHead)
  int64_t tokens;       // tokens per block
  int64_t group;        // bytes per group
  int64_t tile;         // bytes per work item: whole rounds of kThreads * kUnroll * V
  int64_t tiles_per_group;
  int64_t first_group;  // the group holding stream byte begin
  int64_t items;        // (group, tile) pairs over the groups the range touches
  int64_t begin;        // stream byte range [begin, end)
  int64_t end;
  FastDiv run_div, row_div, tokens_div;    // in_group's divisors
  FastDiv tiles_div, nblocks_div, kv_div;  // copy_item's divisors
  int mode;
};

template <int V>
struct VecOf;
template <>
struct VecOf<16> { using T = uint4; };
template <>
struct VecOf<8> { using T = uint2; };
template <>
struct VecOf<4> { using T = uint32_t; };
template <>
struct VecOf<2> { using T = uint16_t; };
template <>
struct VecOf<1> { using T = uint8_t; };

// Pool offset of byte x of a group, relative to the group's base address. prepare() refuses
// groups of 2 GiB or more (no real model comes near: a group is one block's tokens for one
// layer's selected heads), so the math is 32-bit with FastDiv: 64-bit division is a called
// subroutine on the GPU, and live registers across those calls were what made ptxas spill.
__host__ __device__ __forceinline__ int64_t in_group(const Args &a, int64_t x) {
  const uint32_t xs = (uint32_t)x;
  switch (a.mode) {
    case kWholeGroup:
      return x;
    case kPerHead: {
      const uint32_t run = (uint32_t)a.run, h = fdiv(a.run_div, xs);
      return (int64_t)h * a.stride_head + (xs - h * run);
    }
    default: {
      const uint32_t row = (uint32_t)a.row, tokens = (uint32_t)a.tokens;
      const uint32_t u = fdiv(a.row_div, xs), h = fdiv(a.tokens_div, u), t = u - h * tokens;
      return (int64_t)h * a.stride_head + (int64_t)t * a.stride_token + (xs - u * row);
    }
  }
}

// What the emulation checks on every access, as the GPU would fault on it: the two ranges a
// launch may touch (the pool's span and the stream buffer) and alignment to the access size.
// A bad access is counted and skipped, so a wrong index fails a test instead of corrupting the
// test process. Host-only; emulations are serialised by g_emulate_mu.
struct EmulateChecks {
  uintptr_t lo[2], hi[2];  // [pool, pool + span) and [buf, buf + length)
  bool out_of_bounds;
  bool misaligned;
};
EmulateChecks g_emulate;
std::mutex g_emulate_mu;

#ifndef __CUDA_ARCH__  // only the host branches below call it; the device pass would warn
inline bool emulate_access_ok(const void *p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a % n != 0) {
    g_emulate.misaligned = true;
    return false;
  }
  for (int i = 0; i < 2; i++)
    if (a >= g_emulate.lo[i] && a + n <= g_emulate.hi[i]) return true;
  g_emulate.out_of_bounds = true;
  return false;
}
#endif

// Loads and stores one vector (or byte). On the device a plain dereference (the address is
// aligned to V by construction); on the host, where the emulation runs the same code, checked
// memcpy, so the C++ aliasing rules hold.
template <typename Vec>
__host__ __device__ __forceinline__ Vec load_vec(const unsigned char *p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const Vec *>(p);
#else
  Vec v{};
  if (emulate_access_ok(p, sizeof v)) std::memcpy(&v, p, sizeof v);
  return v;
#endif
}

template <typename Vec>
__host__ __device__ __forceinline__ void store_vec(unsigned char *p, const Vec &v) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<Vec *>(p) = v;
#else
  if (emulate_access_ok(p, sizeof v)) std::memcpy(p, &v, sizeof v);
#endif
}

// One thread's share of one (group, tile) work item: rounds of kUnroll vectors of V bytes,
// loads first in each round so they are in flight together, then the range's odd tail bytes
// if this tile holds the range's end. __host__ __device__ so that kvx_cuda_emulate can run
// exactly this code on the CPU, which is how hosts without a GPU test the kernels.
template <int V, bool kGather>
__host__ __device__ __forceinline__ void copy_item(const Args &a, int64_t item, int tid) {
  using Vec = typename VecOf<V>::T;
  constexpr int64_t kRound = (int64_t)kThreads * kUnroll;  // vectors per CTA per round
  const unsigned char *__restrict__ src = a.src_base;
  unsigned char *__restrict__ dst = a.dst_base;
  // prepare() keeps items and group numbers below 2^31, so these three divisions, which every
  // thread of every item pays for, are FastDiv multiplies rather than 64-bit subroutine calls.
  const uint32_t it = (uint32_t)item, tpg = (uint32_t)a.tiles_per_group;
  const uint32_t gi = fdiv(a.tiles_div, it);
  const int64_t tile = it - gi * tpg;
  const uint32_t g = (uint32_t)a.first_group + gi;
  const int64_t g_start = (int64_t)g * a.group;  // stream position of the group's byte 0
  int64_t lo = tile * a.tile, hi = lo + a.tile;
  if (hi > a.group) hi = a.group;
  if (lo < a.begin - g_start) lo = a.begin - g_start;
  if (hi > a.end - g_start) hi = a.end - g_start;
  if (lo >= hi) return;  // uniform across the CTA: an edge tile outside the range
  const uint32_t nb = (uint32_t)a.nblocks, kvf = (uint32_t)a.kv_factor;
  const uint32_t q = fdiv(a.nblocks_div, g), b = g - q * nb;
  const uint32_t layer = fdiv(a.kv_div, q), kv = q - layer * kvf;
  const int64_t base = (int64_t)a.blocks[b] * a.stride_block + (int64_t)layer * a.stride_layer +
                       (int64_t)kv * a.stride_kv + a.base_fixed;
  const int64_t buf0 = g_start - a.begin;  // buffer offset of the group's byte 0
  const int64_t nvec = (hi - lo) / V;
  // Pool offsets first, then loads, then stores: address math (with in_group's divisions)
  // never overlaps live data vectors, which keeps register pressure low and ptxas from
  // spilling the 16-byte kernels.
  for (int64_t round = 0; round < nvec; round += kRound) {  // at most a.tile / (kRound * V)
    int64_t pool_off[kUnroll];
    KVX_UNROLL
    for (int j = 0; j < kUnroll; j++) {
      const int64_t i = round + (int64_t)j * kThreads + tid;
      if (i < nvec) pool_off[j] = base + in_group(a, lo + i * V);
    }
    Vec r[kUnroll];
    KVX_UNROLL
    for (int j = 0; j < kUnroll; j++) {
      const int64_t i = round + (int64_t)j * kThreads + tid;
      if (i < nvec) r[j] = load_vec<Vec>(src + (kGather ? pool_off[j] : buf0 + lo + i * V));
    }
    KVX_UNROLL
    for (int j = 0; j < kUnroll; j++) {
      const int64_t i = round + (int64_t)j * kThreads + tid;
      if (i < nvec) store_vec<Vec>(dst + (kGather ? buf0 + lo + i * V : pool_off[j]), r[j]);
    }
  }
  // Fewer than V bytes, only when the range's length is not a multiple of V.
  for (int64_t x = lo + nvec * V + tid; x < hi; x += kThreads) {
    const int64_t pool = base + in_group(a, x), buf = buf0 + x;
    store_vec<uint8_t>(dst + (kGather ? buf : pool), load_vec<uint8_t>(src + (kGather ? pool : buf)));
  }
}

// The kernels proper, one per direction and vector width (named so ptxas' report reads
// well): grid-stride over the (group, tile) work items.
template <int V>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSM) gather_kernel(const Args a) {
  for (int64_t item = blockIdx.x; item < a.items; item += gridDim.x) copy_item<V, true>(a, item, threadIdx.x);
}

template <int V>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSM) scatter_kernel(const Args a) {
  for (int64_t item = blockIdx.x; item < a.items; item += gridDim.x) copy_item<V, false>(a, item, threadIdx.x);
}

// The CPU twin of a launch: every work item, every thread, in order.
template <int V, bool kGather>
void emulate(const Args &a) {
  for (int64_t item = 0; item < a.items; item++)
    for (int tid = 0; tid < kThreads; tid++) copy_item<V, kGather>(a, item, tid);
}

// A one-thread kernel that spins on the global nanosecond timer; see kvx_cuda_spin.
__global__ void spin_kernel(int64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while ((int64_t)(now - start) < ns);
}

using Kernel = void (*)(const Args);

// Kernel instantiations, indexed by [log2(V)][gather].
const Kernel kKernels[5][2] = {
    {scatter_kernel<1>, gather_kernel<1>},   {scatter_kernel<2>, gather_kernel<2>},
    {scatter_kernel<4>, gather_kernel<4>},   {scatter_kernel<8>, gather_kernel<8>},
    {scatter_kernel<16>, gather_kernel<16>},
};

static_assert(sizeof(kvx_layout_t) == 96 && sizeof(kvx_selection_t) == 32 && sizeof(kvx_cuda_copy_t) == 176,
              "kvx_cuda.h structs must have no padding; the Go mirrors assume it");

// Resident CTAs per device for each kernel (0: not yet measured). Filled on first use; racing
// threads compute the same value, so relaxed atomics suffice.
std::atomic<int> g_max_ctas[kMaxDevices][5][2];

int max_ctas(int device, int vlog, bool gather, int *out) {
  if (device >= 0 && device < kMaxDevices) {
    const int cached = g_max_ctas[device][vlog][gather].load(std::memory_order_relaxed);
    if (cached > 0) {
      *out = cached;
      return 0;
    }
  }
  int per_sm = 0, sms = 0;
  KVX_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernels[vlog][gather], kThreads, 0));
  KVX_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int n = per_sm * sms;
  if (n < 1) n = 1;
  if (device >= 0 && device < kMaxDevices) g_max_ctas[device][vlog][gather].store(n, std::memory_order_relaxed);
  *out = n;
  return 0;
}

int64_t lowest_bit(uint64_t x) { return x == 0 ? 16 : (int64_t)(x & (~x + 1)); }

// Checks a copy and derives the kernel arguments and the vector width (as log2) from it.
// Returns -1 for an empty range (nothing to do), 0 when ready, else a cudaError_t.
int prepare(const kvx_cuda_copy_t *c, bool gather, Args *out, int *out_vlog) {
  if (c == nullptr) return (int)cudaErrorInvalidValue;
  if (c->length == 0) return -1;
  const kvx_layout_t *l = &c->layout;
  const kvx_selection_t *s = &c->sel;
  if (c->length < 0 || c->offset < 0 || c->nblocks <= 0 || c->blocks == 0 || c->pool == 0 || c->buf == 0 ||
      l->kv_factor < 1 || l->tokens_per_block < 1 || l->head_dim < 1 || l->elem_size < 1 ||
      s->layer_begin < 0 || s->layer_end <= s->layer_begin || s->layer_end > l->num_layers ||
      s->head_begin < 0 || s->head_end <= s->head_begin || s->head_end > l->num_heads ||
      c->nblocks > l->num_blocks)
    return (int)cudaErrorInvalidValue;
  const int64_t total = kvx_stream_bytes(l, s, c->nblocks);
  if (c->offset > total || c->length > total - c->offset) return (int)cudaErrorInvalidValue;

  Args a;
  a.blocks = reinterpret_cast<const int32_t *>(c->blocks);
  a.nblocks = c->nblocks;
  a.kv_factor = l->kv_factor;
  a.stride_block = l->stride_block;
  a.stride_layer = l->stride_layer;
  a.stride_kv = l->stride_kv;
  a.stride_head = l->stride_head;
  a.stride_token = l->stride_token;
  a.base_fixed = s->layer_begin * l->stride_layer + s->head_begin * l->stride_head;
  a.row = kvx_row_bytes(l);
  a.tokens = l->tokens_per_block;
  const int64_t heads = kvx_sel_heads(s);
  const int64_t run_units = kvx_run_units(l, s);
  a.mode = run_units == heads * a.tokens ? kWholeGroup : run_units == a.tokens ? kPerHead : kPerRow;
  a.run = run_units * a.row;
  a.group = heads * a.tokens * a.row;
  if (a.group > (int64_t)INT32_MAX) return (int)cudaErrorInvalidValue;  // see FastDiv
  a.run_div = make_fastdiv((uint32_t)a.run);
  a.row_div = make_fastdiv((uint32_t)a.row);
  a.tokens_div = make_fastdiv((uint32_t)a.tokens);
  a.nblocks_div = make_fastdiv((uint32_t)a.nblocks);
  a.kv_div = make_fastdiv((uint32_t)a.kv_factor);
  a.begin = c->offset;
  a.end = c->offset + c->length;

  // Every address is pool/buffer + a sum of these terms; a stride only counts when some index
  // it multiplies can be non-zero.
  uint64_t bits = c->pool | c->buf | (uint64_t)c->offset | (uint64_t)a.row;
  if (l->num_blocks > 1) bits |= (uint64_t)l->stride_block;
  if (l->num_layers > 1) bits |= (uint64_t)l->stride_layer;
  if (l->kv_factor > 1) bits |= (uint64_t)l->stride_kv;
  if (l->num_heads > 1) bits |= (uint64_t)l->stride_head;
  if (l->tokens_per_block > 1) bits |= (uint64_t)l->stride_token;
  int64_t v = lowest_bit(bits);
  if (v > 16) v = 16;
  const int vlog = v == 16 ? 4 : v == 8 ? 3 : v == 4 ? 2 : v == 2 ? 1 : 0;

  a.first_group = a.begin / a.group;
  // Group numbers are 31-bit in copy_item (FastDiv); 2^31 groups would be that many blocks.
  if (kvx_sel_layers(s) * l->kv_factor * c->nblocks > (int64_t)INT32_MAX) return (int)cudaErrorInvalidValue;
  a.src_base = reinterpret_cast<const unsigned char *>(gather ? c->pool : c->buf);
  a.dst_base = reinterpret_cast<unsigned char *>(gather ? c->buf : c->pool);
  *out = a;
  *out_vlog = vlog;
  return 0;
}

// Sizes the work items for a grid of ctas CTAs. A tile is one round (kThreads x kUnroll
// vectors) times as many rounds as keep every CTA busy with about two items or more: big
// tiles amortise each item's index math, enough items keep all SMs fed on small ranges.
int plan_tiles(Args *a, int vlog, int64_t ctas) {
  const int64_t round = (int64_t)kThreads * kUnroll << vlog;
  const int64_t max_rounds = (a->group + round - 1) / round;
  int64_t rounds = (a->end - a->begin) / (round * 2 * (ctas > 0 ? ctas : 1));
  if (rounds < 1) rounds = 1;
  if (rounds > max_rounds) rounds = max_rounds;
  a->tile = round * rounds;
  a->tiles_per_group = (a->group + a->tile - 1) / a->tile;
  const int64_t last_group = (a->end - 1) / a->group;
  a->items = (last_group - a->first_group + 1) * a->tiles_per_group;
  if (a->items > (int64_t)INT32_MAX) return (int)cudaErrorInvalidValue;  // see FastDiv
  a->tiles_div = make_fastdiv((uint32_t)a->tiles_per_group);
  return 0;
}

int launch(int device, const kvx_cuda_copy_t *c, uint64_t stream, bool gather) {
  Args a;
  int vlog = 0;
  const int prc = prepare(c, gather, &a, &vlog);
  if (prc == -1) return 0;  // empty input succeeds at once, launching nothing
  if (prc != 0) return prc;
  KVX_TRY(cudaSetDevice(device));
  int ctas = 0;
  const int rc = max_ctas(device, vlog, gather, &ctas);
  if (rc != 0) return rc;
  const int trc = plan_tiles(&a, vlog, ctas);
  if (trc != 0) return trc;
  const int64_t grid = a.items < ctas ? a.items : ctas;
  void *params[] = {&a};
  KVX_TRY(cudaLaunchKernel(reinterpret_cast<const void *>(kKernels[vlog][gather]), dim3((unsigned)grid),
                           dim3(kThreads), params, 0, reinterpret_cast<cudaStream_t>(stream)));
  return 0;
}

struct AbiEntry {
  const char *name;
  int64_t value;
};

#define KVX_SIZE(T) {#T, (int64_t)sizeof(T)}
#define KVX_FIELD(T, f) {#T "." #f, (int64_t)offsetof(T, f)}

const AbiEntry kAbi[] = {
    KVX_SIZE(kvx_layout_t),
    KVX_FIELD(kvx_layout_t, num_layers),
    KVX_FIELD(kvx_layout_t, kv_factor),
    KVX_FIELD(kvx_layout_t, num_heads),
    KVX_FIELD(kvx_layout_t, head_dim),
    KVX_FIELD(kvx_layout_t, elem_size),
    KVX_FIELD(kvx_layout_t, tokens_per_block),
    KVX_FIELD(kvx_layout_t, num_blocks),
    KVX_FIELD(kvx_layout_t, stride_block),
    KVX_FIELD(kvx_layout_t, stride_layer),
    KVX_FIELD(kvx_layout_t, stride_kv),
    KVX_FIELD(kvx_layout_t, stride_head),
    KVX_FIELD(kvx_layout_t, stride_token),
    KVX_SIZE(kvx_selection_t),
    KVX_FIELD(kvx_selection_t, layer_begin),
    KVX_FIELD(kvx_selection_t, layer_end),
    KVX_FIELD(kvx_selection_t, head_begin),
    KVX_FIELD(kvx_selection_t, head_end),
    KVX_SIZE(kvx_cuda_copy_t),
    KVX_FIELD(kvx_cuda_copy_t, layout),
    KVX_FIELD(kvx_cuda_copy_t, sel),
    KVX_FIELD(kvx_cuda_copy_t, blocks),
    KVX_FIELD(kvx_cuda_copy_t, nblocks),
    KVX_FIELD(kvx_cuda_copy_t, pool),
    KVX_FIELD(kvx_cuda_copy_t, buf),
    KVX_FIELD(kvx_cuda_copy_t, offset),
    KVX_FIELD(kvx_cuda_copy_t, length),
};

}  // namespace

extern "C" {

int kvx_cuda_abi_version(void) { return KVX_CUDA_ABI_VERSION; }

int kvx_cuda_runtime_version(void) { return CUDART_VERSION; }

int64_t kvx_cuda_abi_offset(const char *name) {
  if (name == nullptr) return -1;
  for (const AbiEntry &e : kAbi)
    if (std::strcmp(e.name, name) == 0) return e.value;
  return -1;
}

int kvx_cuda_open(int device) {
  KVX_TRY(cudaSetDevice(device));
  KVX_TRY(cudaFree(nullptr));  // creates the primary context now, not inside the first launch
  for (int vlog = 0; vlog < 5; vlog++)
    for (int gather = 0; gather < 2; gather++) {
      int n = 0;
      const int rc = max_ctas(device, vlog, gather != 0, &n);
      if (rc != 0) return rc;
    }
  return 0;
}

int kvx_cuda_device_info(int device, char *name, int64_t cap, int32_t *sm_count, int32_t *cc_major,
                         int32_t *cc_minor, int64_t *total_mem) {
  cudaDeviceProp p;
  KVX_TRY(cudaGetDeviceProperties(&p, device));
  if (name != nullptr && cap > 0) {
    std::strncpy(name, p.name, (size_t)cap - 1);
    name[cap - 1] = '\0';
  }
  if (sm_count != nullptr) *sm_count = p.multiProcessorCount;
  if (cc_major != nullptr) *cc_major = p.major;
  if (cc_minor != nullptr) *cc_minor = p.minor;
  if (total_mem != nullptr) *total_mem = (int64_t)p.totalGlobalMem;
  return 0;
}

int kvx_cuda_malloc(int device, uint64_t *ptr, int64_t bytes) {
  if (ptr == nullptr || bytes <= 0) return (int)cudaErrorInvalidValue;
  KVX_TRY(cudaSetDevice(device));
  void *p = nullptr;
  KVX_TRY(cudaMalloc(&p, (size_t)bytes));
  *ptr = reinterpret_cast<uint64_t>(p);
  return 0;
}

int kvx_cuda_free(int device, uint64_t ptr) {
  KVX_TRY(cudaSetDevice(device));
  KVX_TRY(cudaFree(reinterpret_cast<void *>(ptr)));
  return 0;
}

int kvx_cuda_memset(int device, uint64_t ptr, int value, int64_t bytes, uint64_t stream) {
  if (bytes == 0) return 0;
  if (bytes < 0) return (int)cudaErrorInvalidValue;
  KVX_TRY(cudaSetDevice(device));
  KVX_TRY(cudaMemsetAsync(reinterpret_cast<void *>(ptr), value, (size_t)bytes, reinterpret_cast<cudaStream_t>(stream)));
  return 0;
}

int kvx_cuda_memcpy(int device, uint64_t dst, uint64_t src, int64_t bytes, uint64_t stream) {
  if (bytes == 0) return 0;
  if (bytes < 0) return (int)cudaErrorInvalidValue;
  KVX_TRY(cudaSetDevice(device));
  KVX_TRY(cudaMemcpyAsync(reinterpret_cast<void *>(dst), reinterpret_cast<const void *>(src), (size_t)bytes,
                          cudaMemcpyDeviceToDevice, reinterpret_cast<cudaStream_t>(stream)));
  return 0;
}

int kvx_cuda_copy_to_device(int device, uint64_t dst, const void *src, int64_t bytes) {
  if (bytes == 0) return 0;
  if (bytes < 0 || src == nullptr) return (int)cudaErrorInvalidValue;
  KVX_TRY(cudaSetDevice(device));
  KVX_TRY(cudaMemcpy(reinterpret_cast<void *>(dst), src, (size_t)bytes, cudaMemcpyHostToDevice));
  return 0;
}

int kvx_cuda_copy_to_host(int device, void *dst, uint64_t src, int64_t bytes) {
  if (bytes == 0) return 0;
  if (bytes < 0 || dst == nullptr) return (int)cudaErrorInvalidValue;
  KVX_TRY(cudaSetDevice(device));
  KVX_TRY(cudaMemcpy(dst, reinterpret_cast<const void *>(src), (size_t)bytes, cudaMemcpyDeviceToHost));
  return 0;
}

int kvx_cuda_stream_create(int device, uint64_t *stream) {
  if (stream == nullptr) return (int)cudaErrorInvalidValue;
  KVX_TRY(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  KVX_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = reinterpret_cast<uint64_t>(s);
  return 0;
}

int kvx_cuda_stream_destroy(int device, uint64_t stream) {
  KVX_TRY(cudaSetDevice(device));
  KVX_TRY(cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream)));
  return 0;
}

int kvx_cuda_stream_query(int device, uint64_t stream) {
  KVX_TRY(cudaSetDevice(device));
  return (int)cudaStreamQuery(reinterpret_cast<cudaStream_t>(stream));
}

int kvx_cuda_event_create(int device, uint64_t *event, int timing) {
  if (event == nullptr) return (int)cudaErrorInvalidValue;
  KVX_TRY(cudaSetDevice(device));
  cudaEvent_t e = nullptr;
  KVX_TRY(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  *event = reinterpret_cast<uint64_t>(e);
  return 0;
}

int kvx_cuda_event_destroy(int device, uint64_t event) {
  KVX_TRY(cudaSetDevice(device));
  KVX_TRY(cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event)));
  return 0;
}

int kvx_cuda_event_record(int device, uint64_t event, uint64_t stream) {
  KVX_TRY(cudaSetDevice(device));
  KVX_TRY(cudaEventRecord(reinterpret_cast<cudaEvent_t>(event), reinterpret_cast<cudaStream_t>(stream)));
  return 0;
}

int kvx_cuda_event_query(int device, uint64_t event) {
  KVX_TRY(cudaSetDevice(device));
  return (int)cudaEventQuery(reinterpret_cast<cudaEvent_t>(event));
}

int kvx_cuda_event_elapsed(int device, float *ms, uint64_t start, uint64_t end) {
  if (ms == nullptr) return (int)cudaErrorInvalidValue;
  KVX_TRY(cudaSetDevice(device));
  KVX_TRY(cudaEventElapsedTime(ms, reinterpret_cast<cudaEvent_t>(start), reinterpret_cast<cudaEvent_t>(end)));
  return 0;
}

int kvx_cuda_gather(int device, const kvx_cuda_copy_t *c, uint64_t stream) { return launch(device, c, stream, true); }

int kvx_cuda_scatter(int device, const kvx_cuda_copy_t *c, uint64_t stream) { return launch(device, c, stream, false); }

int kvx_cuda_emulate(const kvx_cuda_copy_t *c, int gather, int64_t ctas) {
  Args a;
  int vlog = 0;
  const int prc = prepare(c, gather != 0, &a, &vlog);
  if (prc == -1) return 0;
  if (prc != 0) return prc;
  const int trc = plan_tiles(&a, vlog, ctas);
  if (trc != 0) return trc;
  std::lock_guard<std::mutex> lock(g_emulate_mu);
  g_emulate = EmulateChecks{};
  g_emulate.lo[0] = (uintptr_t)c->pool;
  g_emulate.hi[0] = (uintptr_t)c->pool + (uintptr_t)kvx_pool_span(&c->layout);
  g_emulate.lo[1] = (uintptr_t)c->buf;
  g_emulate.hi[1] = (uintptr_t)c->buf + (uintptr_t)c->length;
  switch (vlog) {
    case 4: gather ? emulate<16, true>(a) : emulate<16, false>(a); break;
    case 3: gather ? emulate<8, true>(a) : emulate<8, false>(a); break;
    case 2: gather ? emulate<4, true>(a) : emulate<4, false>(a); break;
    case 1: gather ? emulate<2, true>(a) : emulate<2, false>(a); break;
    default: gather ? emulate<1, true>(a) : emulate<1, false>(a); break;
  }
  if (g_emulate.out_of_bounds) return (int)cudaErrorIllegalAddress;
  if (g_emulate.misaligned) return (int)cudaErrorMisalignedAddress;
  return 0;
}

int kvx_cuda_vector_bytes(const kvx_cuda_copy_t *c) {
  Args a;
  int vlog = 0;
  const int prc = prepare(c, true, &a, &vlog);
  if (prc == -1) return 0;
  if (prc != 0) return -prc;
  return 1 << vlog;
}

uint32_t kvx_cuda_fastdiv(uint32_t d, uint32_t x) { return fdiv(make_fastdiv(d), x); }

int kvx_cuda_spin(int device, int64_t ms, uint64_t stream) {
  // A spin longer than 10 s would trip display watchdogs and stall test suites; refuse it.
  if (ms < 0 || ms > 10000) return (int)cudaErrorInvalidValue;
  KVX_TRY(cudaSetDevice(device));
  const int64_t ns = ms * 1000000;
  void *params[] = {const_cast<int64_t *>(&ns)};
  KVX_TRY(cudaLaunchKernel(reinterpret_cast<const void *>(spin_kernel), dim3(1), dim3(1), params, 0,
                           reinterpret_cast<cudaStream_t>(stream)));
  return 0;
}

}  // extern "C"
