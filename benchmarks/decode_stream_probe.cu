// Decode attention's stream at batch 1 (32 heads, 4096 keys, head dim 128, fp16: 64 MiB of K and
// V), on raw CUDA: what reading it costs in each load form, and what merging a head's chunks costs.
// A probe of the hardware for the split-KV chunk step (fastdlight/schedules/decode_attention.py);
// nothing in the package uses it. The read forms are in decode_stream_probe_reads.cuh.
//
//   nvcc -O3 -arch=sm_90a -std=c++17 benchmarks/decode_stream_probe.cu -o decode_stream_probe
//   ./decode_stream_probe read     # the load forms, each CTA a chunk of K and of V (16 chunks a head)
//   ./decode_stream_probe merge    # 16, 8 and 4 chunks a head: no merge, a ticket, a cluster, flagged partials
//                                  # with a relaxed ticket; each output checked against the ticket's
//   ./decode_stream_probe timeline # 16 chunks: the ticket's parts one at a time, each CTA's %globaltimer stamps
//   ./decode_stream_probe balance  # the cache in equal runs of keys, 4 and 8 CTAs an SM, against the 16 chunks a
//                                  # head; when CTAs end, by how many CTAs their SM held
//   ./decode_stream_probe steal    # a head's 16 CTAs taking its keys in granules from a counter, against
//                                  # the static chunks with and without the same ending (each CTA
//                                  # counted out); when the CTAs of one launch end
//
// Every kernel reads three copies of the cache in turn (192 MiB, past the L2), XORs what it loads
// and stores only if the XOR hits a value it never does. Each time is the median of 21 replays of a
// CUDA graph of 40 launches, divided by 40. The merge's partial results are stand-ins (the XOR of a
// thread's loads), so its arithmetic is the real merge's on made-up values.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
namespace cg = cooperative_groups;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

constexpr int HEADS = 32, KEYS = 4096, DB = 256, D = 128;  // DB: bytes a key (128 fp16 values)
constexpr int CHUNKS = 16, CHUNK_KEYS = KEYS / CHUNKS;     // the read forms' split
constexpr size_t HALF = (size_t)HEADS * KEYS * DB;         // the bytes of K (V follows)
constexpr int MERGE_TILE = 32, MERGE_STAGES = 3;           // the merge probe's ring
constexpr int MERGE_RING = MERGE_STAGES * 2 * MERGE_TILE * DB, MERGE_SMEM = MERGE_RING + 1024;  // (scratch past the ring)

__device__ __forceinline__ uint32_t x4(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// A kernel's shared memory is one dynamic buffer: the ring first, declared 128-byte aligned, anything
// else after it. Static __shared__ variables sit ahead of the dynamic buffer: with the ring declared
// without alignment, 16 bytes of one moved it off its 128-byte boundary and cost the merge forms'
// stream 2.4 us (H200); declared aligned, the static part is padded (``timeline``'s STATIC_PAD form)
template <typename T>
__device__ __forceinline__ T* past(uint4* ring, int bytes) { return reinterpret_cast<T*>(reinterpret_cast<char*>(ring) + bytes); }

// ring step t: tile t's stage XORed into ``acc`` once its copy is in, then tile t + STAGES - 1 issued
// (``issue``) into the stage it frees
template <int STAGES, int PER, typename Issue>
__device__ __forceinline__ void ring_step(const uint4* ring, int t, uint32_t& acc, Issue issue) {
  asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2) : "memory");
  int st = t % STAGES;
  #pragma unroll
  for (int j = 0; j < 2 * PER; j++) acc ^= x4(ring[(st * 2 * PER + j) * 128 + threadIdx.x]);
  issue(t + STAGES - 1);
}

// a CTA's chunk (of C a head) of K and V through a ring of STAGES tiles, copied by cp.async (each
// thread the 16-byte pieces it reads back): the XOR of what it read. A tile is TILE keys of K and
// of V; or, K_THEN_V, 2 TILE keys of one of them, the chunk's K first and then its V
template <int TILE, int STAGES, int C, bool K_THEN_V = false>
__device__ __forceinline__ uint32_t ring_read(const uint4* buf, uint4* ring) {
  constexpr int CHUNK = KEYS / C, PER = TILE * DB / 16 / 128, NT = CHUNK / TILE;  // PER: pieces of K a tile
  int head = blockIdx.x / C, chunk = blockIdx.x % C;
  const char* k = (const char*)buf + ((size_t)head * KEYS + chunk * CHUNK) * DB;
  const char* v = k + HALF;
  auto piece = [&](int t, int j) {  // tile t's piece j of a thread (of 2 PER)
    if (K_THEN_V) return (const uint4*)((t < NT / 2 ? k : v) + (t % (NT / 2)) * 2 * TILE * DB) + j * 128 + threadIdx.x;
    return (const uint4*)((j < PER ? k : v) + t * TILE * DB) + (j % PER) * 128 + threadIdx.x;
  };
  uint32_t acc = 0;
  auto issue = [&](int t) {
    int st = t % STAGES;
    #pragma unroll
    for (int j = 0; j < 2 * PER; j++)
      if (t < NT) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_addr(&ring[(st * 2 * PER + j) * 128 + threadIdx.x])), "l"(piece(t, j)));
    asm volatile("cp.async.commit_group;");
  };
  for (int t = 0; t < STAGES - 1; t++) issue(t);
  for (int t = 0; t < NT; t++) {
    ring_step<STAGES, PER>(ring, t, acc, issue);
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  return acc;
}

using ReadKernel = void (*)(const uint4*, uint32_t*);
using StepKernel = void (*)(const uint4*, float*, float*, int*);

// the median time of one launch (us): ``launch(stream, copy)`` 40 times in a CUDA graph
template <typename F>
float time_graph(F launch, int copies) {
  cudaStream_t s; CK(cudaStreamCreate(&s));
  const int reps = 40;
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < reps; i++) launch(s, i % copies);
  CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, s));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  std::vector<float> us;
  for (int r = 0; r < 21; r++) {
    CK(cudaEventRecord(a, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(b, s)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); us.push_back(ms * 1000.f / reps);
  }
  std::sort(us.begin(), us.end());
  CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g)); CK(cudaStreamDestroy(s));
  return us[us.size() / 2];
}

void report(const char* name, float us) { printf("%-44s %8.2f us  %6.3f TB/s\n", name, us, 2.0 * HALF / 1e6 / us); }

#include "decode_stream_probe_reads.cuh"

// ---- the timeline: thread 0 of each CTA stamps %globaltimer (ns, one clock for the GPU) and
// ---- clock64 (its SM's cycles) at the points of a merge form; ``timeline`` reads them back
constexpr int STAMPS = 5;  // start, chunk streamed, partial written, ticket back, merged
__device__ unsigned long long g_time[HEADS * 16 * STAMPS], g_cycles[HEADS * 16 * STAMPS];
__device__ __forceinline__ void stamp(int k) {
  if (threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
  g_time[blockIdx.x * STAMPS + k] = t;
  g_cycles[blockIdx.x * STAMPS + k] = clock64();
}

// ---- the merge: a CTA per (head, chunk) streams its chunk (a cp.async ring of 32-key tiles, 3
// ---- stages) into a stand-in partial result (max, sum, 128 values); then (none) each writes it only;
// ---- (ticket) each writes it and takes a ticket with atom.acq_rel.gpu, the head's last CTA loads all
// ---- and merges; (cluster) the head's C CTAs are a thread-block cluster: partials in shared memory,
// ---- a cluster barrier, rank 0 reads them over distributed shared memory and merges, a second barrier;
// ---- (flagged) below
template <int C>
__device__ __forceinline__ float stream_chunk(const uint4* buf, uint4* ring) {
  // the thread's stand-in value
  return (float)(ring_read<MERGE_TILE, MERGE_STAGES, C>(buf, ring) & 0xFFFF) * 1e-6f;
}

// a CTA's stand-in partial result: [0] max, [1] sum, [2 + i] value i (thread i's)
__device__ __forceinline__ void write_partial(float* p, float x) {
  p[2 + threadIdx.x] = x;
  if (threadIdx.x == 0) { p[0] = x; p[1] = 1.0f + x; }
}

// thread i's output value from C chunks' maxima (exp2 domain), sums and values i
template <int C>
__device__ __forceinline__ float merged(const float* m, const float* l, const float* o) {
  float mx = m[0];
  #pragma unroll
  for (int c = 1; c < C; c++) mx = fmaxf(mx, m[c]);
  float s = 0.f, acc = 0.f;
  #pragma unroll
  for (int c = 0; c < C; c++) { float w = exp2f(m[c] - mx); s += w * l[c]; acc += w * o[c]; }
  return acc / s;
}

// the merging CTA's part: every partial of the head loaded in one round trip, merged, written; the
// head's counter left at zero
template <int C>
__device__ __forceinline__ void merge_head(const float* part, float* out, int* counter, int head) {
  const float* hp = part + (size_t)head * C * (D + 2);
  float m[C], l[C], o[C];
  #pragma unroll
  for (int c = 0; c < C; c++) { m[c] = hp[c * (D + 2)]; l[c] = hp[c * (D + 2) + 1]; o[c] = hp[c * (D + 2) + 2 + threadIdx.x]; }
  out[head * D + threadIdx.x] = merged<C>(m, l, o);
  if (threadIdx.x == 0) *counter = 0;
}

template <int C>
__global__ void __launch_bounds__(128) step_none(const uint4* __restrict__ buf, float* part, float* out, int* tickets) {
  extern __shared__ __align__(128) uint4 ring[];
  float x = stream_chunk<C>(buf, ring);
  write_partial(part + (size_t)blockIdx.x * (D + 2), x);
}

template <int C>
__global__ void __launch_bounds__(128) step_ticket(const uint4* __restrict__ buf, float* part, float* out, int* tickets) {
  extern __shared__ __align__(128) uint4 ring[];
  int& last = *past<int>(ring, MERGE_RING);
  float x = stream_chunk<C>(buf, ring);
  int head = blockIdx.x / C;
  write_partial(part + (size_t)blockIdx.x * (D + 2), x);
  __syncthreads();
  if (threadIdx.x == 0) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(tickets + head) : "memory");
    last = old == C - 1;
  }
  __syncthreads();
  if (!last) return;
  merge_head<C>(part, out, tickets + head, head);
}

// the ticket's parts one at a time, to time each, with stamps: (0) the partial written (step_none's
// form), (1) and a CTA barrier, (2) and a relaxed add to the head's counter, (3) the add an acq_rel
// one (the ticket), (4) and the last CTA's loads of the partials, (5) the whole merge (step_ticket's
// form); STATIC_PAD: with 16 bytes of static shared memory ahead of the ring
template <int C, int PARTS, bool STATIC_PAD = false>
__global__ void __launch_bounds__(128) step_parts(const uint4* __restrict__ buf, float* part, float* out, int* tickets) {
  extern __shared__ __align__(128) uint4 ring[];
  int& last = *past<int>(ring, MERGE_RING);
  stamp(0);
  float x = stream_chunk<C>(buf, ring);
  stamp(1);
  int head = blockIdx.x / C;
  write_partial(part + (size_t)blockIdx.x * (D + 2), x);
  if (PARTS == 0) { stamp(2); return; }
  __syncthreads();
  stamp(2);
  if (STATIC_PAD) {
    __shared__ int pad[4];
    if (threadIdx.x == 0) pad[0] = x == 1234.5f;
    __syncthreads();
    if (pad[0]) out[0] = x;
  }
  if (PARTS >= 2 && threadIdx.x == 0) {
    int old;
    if (PARTS == 2) asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(tickets + head) : "memory");
    else asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(tickets + head) : "memory");
    last = old == C - 1;
  }
  __syncthreads();
  stamp(3);
  if (PARTS < 2 || !last) return;
  if (PARTS == 4) {
    const float* hp = part + (size_t)head * C * (D + 2);
    float acc = 0.f;
    #pragma unroll
    for (int c = 0; c < C; c++) acc += hp[c * (D + 2) + 2 + threadIdx.x];
    if (acc == 1234.5f) out[head * D + threadIdx.x] = acc;
    if (threadIdx.x == 0) tickets[head] = 0;
  } else if (PARTS == 5) {
    merge_head<C>(part, out, tickets + head, head);
  } else if (threadIdx.x == 0) {
    tickets[head] = 0;
  }
  __syncthreads();
  stamp(4);
}

// ---- flagged partials: each of a partial's values travels with a flag in one 64-bit word (the
// ---- head's phase, 1 or 2, which the merging CTA flips), so the merging CTA checks each word it
// ---- loads instead of a release and an acquire ordering them: no fence, no wait for the stores
// ---- before the ticket. The words live in a persistent workspace that nothing else writes.
#define PHASE(head) (HEADS + (head))  // (past the heads' counters)
__device__ __forceinline__ void st_flagged(unsigned long long* p, float x, uint32_t flag) {
  unsigned long long w = ((unsigned long long)flag << 32) | __float_as_uint(x);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" :: "l"(p), "l"(w) : "memory");
}
__device__ __forceinline__ unsigned long long ld_flagged(const unsigned long long* p) {
  unsigned long long w;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
  return w;
}
__device__ __forceinline__ float flagged_value(unsigned long long w) { return __uint_as_float((uint32_t)w); }

// a partial's words: [0] max, [1] sum, [2 + i] value i, each with the flag
__device__ __forceinline__ void write_flagged(unsigned long long* p, float x, uint32_t flag) {
  st_flagged(p + 2 + threadIdx.x, x, flag);
  if (threadIdx.x == 0) { st_flagged(p, x, flag); st_flagged(p + 1, 1.0f + x, flag); }
}

// every partial of the head loaded at once, each word loaded again until its flag is this
// launch's (thread c < C loads chunk c's max and sum for the CTA into ``ml``, each thread its values)
template <int C>
__device__ __forceinline__ void merge_flagged(const unsigned long long* ws, float* out, int head, uint32_t flag, float* ml) {
  const unsigned long long* hp = ws + (size_t)head * C * (D + 2);
  unsigned long long o[C], m = 0, l = 0;
  int t = threadIdx.x;
  if (t < C) { m = ld_flagged(hp + t * (D + 2)); l = ld_flagged(hp + t * (D + 2) + 1); }
  #pragma unroll
  for (int c = 0; c < C; c++) o[c] = ld_flagged(hp + c * (D + 2) + 2 + t);
  if (t < C) {
    while ((m >> 32) != flag) m = ld_flagged(hp + t * (D + 2));
    while ((l >> 32) != flag) l = ld_flagged(hp + t * (D + 2) + 1);
    ml[t] = flagged_value(m); ml[C + t] = flagged_value(l);
  }
  float of[C];
  #pragma unroll
  for (int c = 0; c < C; c++) {
    while ((o[c] >> 32) != flag) o[c] = ld_flagged(hp + c * (D + 2) + 2 + t);
    of[c] = flagged_value(o[c]);
  }
  __syncthreads();
  out[head * D + t] = merged<C>(ml, ml + C, of);
}

// the ticket without a fence: each CTA writes its flagged partial and adds to the head's counter
// (relaxed, not waiting for its stores); the last merges. tickets[PHASE(head)]: the head's phase.
// (Four CTAs an SM, as the others: the merge's words would otherwise take more registers.)
template <int C>
__global__ void __launch_bounds__(128, 4) step_flagged(const uint4* __restrict__ buf, float* part, float* out, int* tickets) {
  extern __shared__ __align__(128) uint4 ring[];
  int& last = *past<int>(ring, MERGE_RING);
  auto* ws = reinterpret_cast<unsigned long long*>(part);
  int head = blockIdx.x / C;
  uint32_t flag = 1 + *(volatile int*)(tickets + PHASE(head));
  float x = stream_chunk<C>(buf, ring);
  write_flagged(ws + (size_t)blockIdx.x * (D + 2), x, flag);
  if (threadIdx.x == 0) {
    int old;
    asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(tickets + head) : "memory");
    last = old == C - 1;
  }
  __syncthreads();
  if (!last) return;
  merge_flagged<C>(ws, out, head, flag, past<float>(ring, MERGE_RING + 64));
  if (threadIdx.x == 0) { tickets[head] = 0; tickets[PHASE(head)] = flag == 1 ? 1 : 0; }
}

template <int C>
__global__ void __launch_bounds__(128) step_cluster(const uint4* __restrict__ buf, float* part, float* out, int* tickets) {
  extern __shared__ __align__(128) uint4 ring[];
  float* mine = past<float>(ring, MERGE_RING);
  cg::cluster_group cluster = cg::this_cluster();
  float x = stream_chunk<C>(buf, ring);
  write_partial(mine, x);
  cluster.sync();
  if (cluster.block_rank() == 0) {
    float m[C], l[C], o[C];
    #pragma unroll
    for (int c = 0; c < C; c++) {
      const float* r = cluster.map_shared_rank(mine, c);
      m[c] = r[0]; l[c] = r[1]; o[c] = r[2 + threadIdx.x];
    }
    out[(blockIdx.x / C) * D + threadIdx.x] = merged<C>(m, l, o);
  }
  cluster.sync();  // no CTA leaves while rank 0 may still read its partial
}


template <int C>
void merge_forms(const std::vector<uint4*>& bufs, float* part, float* out, int* tickets) {
  const int smem = MERGE_SMEM;
  StepKernel ks[4] = {step_none<C>, step_ticket<C>, step_cluster<C>, step_flagged<C>};
  for (StepKernel k : ks) CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(step_cluster<C>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchAttribute attr[1]; attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = C; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
  auto config = [&](cudaStream_t s, bool cluster) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(HEADS * C); cfg.blockDim = dim3(128); cfg.dynamicSmemBytes = smem; cfg.stream = s;
    cfg.attrs = attr; cfg.numAttrs = cluster ? 1 : 0;
    return cfg;
  };
  cudaLaunchConfig_t probe = config(nullptr, true);
  int resident = 0; CK(cudaOccupancyMaxActiveClusters(&resident, (void*)step_cluster<C>, &probe));
  printf("%d chunks a head: %d clusters of %d CTAs resident at once (the grid has %d)\n", C, resident, C, HEADS);
  const char* names[4] = {"no merge", "a ticket, the last CTA merges", "a cluster, merged over DSMEM",
                          "flagged partials, a relaxed ticket"};
  std::vector<float> want(HEADS * D), got(HEADS * D);
  for (int i = 0; i < 4; i++) {
    CK(cudaMemset(part, 0, HEADS * 16 * (D + 2) * 8)); CK(cudaMemset(out, 0, HEADS * D * 4));
    char name[80]; snprintf(name, sizeof name, "  %2d chunks, %s", C, names[i]);
    auto launch = [&](cudaStream_t s, int c) {
      cudaLaunchConfig_t cfg = config(s, i == 2);
      CK(cudaLaunchKernelEx(&cfg, ks[i], (const uint4*)bufs[c], part, out, tickets));
    };
    report(name, time_graph(launch, (int)bufs.size()));
    if (i == 0) continue;  // (no merge: no output)
    CK(cudaMemset(out, 0, HEADS * D * 4)); launch(nullptr, 0); CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(i == 1 ? want.data() : got.data(), out, HEADS * D * 4, cudaMemcpyDeviceToHost));
    if (i > 1 && memcmp(want.data(), got.data(), HEADS * D * 4)) printf("    MISMATCH against the ticket's output\n");
  }
}

// the timeline of ``k`` (a CTA per chunk of 16 a head): launched alone 30 times over the copies in
// turn (after 10 unstamped); from each launch's stamps (us from its first CTA's start) when the
// CTAs' streams end and its last stamp, and the merging CTAs' worst partial write (with its
// barrier), ticket and merge (own clocks); medians. Then its time in a CUDA graph
void timeline(const char* name, StepKernel k, bool merges, const std::vector<uint4*>& bufs, float* part, float* out, int* tickets) {
  const int C = 16, grid = HEADS * C, smem = MERGE_SMEM;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int khz = 0; CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  std::vector<unsigned long long> t(grid * STAMPS), cy(grid * STAMPS);
  std::vector<std::vector<double>> cols(6);
  for (int it = 0; it < 40; it++) {
    k<<<grid, 128, smem>>>(bufs[it % bufs.size()], part, out, tickets);
    CK(cudaDeviceSynchronize());
    if (it < 10) continue;
    CK(cudaMemcpyFromSymbol(t.data(), g_time, grid * STAMPS * 8)); CK(cudaMemcpyFromSymbol(cy.data(), g_cycles, grid * STAMPS * 8));
    unsigned long long t0 = ~0ull, s1min = ~0ull, s1max = 0, end = 0;
    double write = 0, wait = 0, merge = 0;
    for (int c = 0; c < grid; c++) t0 = std::min(t0, t[c * STAMPS]);
    for (int c = 0; c < grid; c++) {
      const unsigned long long *p = &t[c * STAMPS], *q = &cy[c * STAMPS];
      s1min = std::min(s1min, p[1]); s1max = std::max(s1max, p[1]);
      write = std::max(write, (q[2] - q[1]) * 1e3 / khz);
      bool merger = merges && p[3] >= p[2] && p[4] >= p[3];  // (a CTA's stamps of earlier launches stay)
      end = std::max(end, merger ? p[4] : merges ? p[3] : p[2]);
      if (merger) { wait = std::max(wait, (q[3] - q[2]) * 1e3 / khz); merge = std::max(merge, (q[4] - q[3]) * 1e3 / khz); }
    }
    double row[6] = {(s1min - t0) * 1e-3, (s1max - t0) * 1e-3, (end - t0) * 1e-3, write, wait, merge};
    for (int i = 0; i < 6; i++) cols[i].push_back(row[i]);
  }
  double med[6];
  for (int i = 0; i < 6; i++) { std::sort(cols[i].begin(), cols[i].end()); med[i] = cols[i][cols[i].size() / 2]; }
  float graph = time_graph([&](cudaStream_t s, int c) { k<<<grid, 128, smem, s>>>(bufs[c], part, out, tickets); }, (int)bufs.size());
  printf("%-34s graph %6.2f | streams end %5.2f..%5.2f | last stamp %5.2f | write %4.2f ticket %4.2f merge %4.2f us\n",
         name, graph, med[0], med[1], med[2], med[3], med[4], med[5]);
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "read";
  if (strcmp(mode, "read") && strcmp(mode, "merge") && strcmp(mode, "timeline") && strcmp(mode, "balance") && strcmp(mode, "steal")) {
    printf("usage: %s read|merge|timeline|balance|steal\n", argv[0]);
    return 2;
  }
  std::vector<uint4*> bufs(3);
  for (auto& p : bufs) { CK(cudaMalloc(&p, 2 * HALF)); CK(cudaMemset(p, 1, 2 * HALF)); }
  uint32_t* sink; CK(cudaMalloc(&sink, 8192 * 4));
  float *part, *out; int* tickets;
  CK(cudaMalloc(&part, HEADS * 16 * (D + 2) * 8)); CK(cudaMemset(part, 0, HEADS * 16 * (D + 2) * 8)); CK(cudaMalloc(&out, HEADS * D * 4));
  CK(cudaMalloc(&tickets, 2 * HEADS * 4)); CK(cudaMemset(tickets, 0, 2 * HEADS * 4));
  if (!strcmp(mode, "read")) {
    read_forms(bufs, sink);
  } else if (!strcmp(mode, "balance")) {
    balance_forms(bufs, sink);
  } else if (!strcmp(mode, "steal")) {
    steal_forms(bufs, sink, tickets);
  } else if (!strcmp(mode, "timeline")) {
    for (int r = 0; r < 2; r++) {
      timeline("16 chunks, no merge", step_parts<16, 0>, false, bufs, part, out, tickets);
      timeline("  the partial, a barrier", step_parts<16, 1>, false, bufs, part, out, tickets);
      timeline("  and a relaxed add", step_parts<16, 2>, true, bufs, part, out, tickets);
      timeline("  the add acq_rel", step_parts<16, 3>, true, bufs, part, out, tickets);
      timeline("  the last loads the partials", step_parts<16, 4>, true, bufs, part, out, tickets);
      timeline("  the last merges (the ticket)", step_parts<16, 5>, true, bufs, part, out, tickets);
      timeline("  (1), 16 B static smem ahead", step_parts<16, 1, true>, false, bufs, part, out, tickets);
    }
  } else {
    merge_forms<16>(bufs, part, out, tickets);
    merge_forms<8>(bufs, part, out, tickets);
    merge_forms<4>(bufs, part, out, tickets);
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
