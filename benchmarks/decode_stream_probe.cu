// Decode attention's stream at batch 1 (32 heads, 4096 keys, head dim 128, fp16: 64 MiB of K and
// V), on raw CUDA: what reading it costs in each load form, and what merging a head's chunks costs.
// A probe of the hardware for the split-KV chunk step (fastdlight/schedules/decode_attention.py);
// nothing in the package uses it.
//
//   nvcc -O3 -arch=sm_90a -std=c++17 benchmarks/decode_stream_probe.cu -o decode_stream_probe
//   ./decode_stream_probe read     # the load forms, each CTA a chunk of K and of V (16 chunks a head)
//   ./decode_stream_probe merge    # 16, 8 and 4 chunks a head: no merge, a ticket, the last to start, a cluster
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

__device__ __forceinline__ uint32_t x4(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// ---- the read forms: ldg into two register sets, a cp.async ring, cp.async.bulk tiles with mbarriers,
// ---- a cp.async ring that reads the chunk's K and then its V, and a grid-stride read of all of it
template <int TILE>
__global__ void __launch_bounds__(128) ldg_read(const uint4* __restrict__ buf, uint32_t* out) {
  int head = blockIdx.x / CHUNKS, chunk = blockIdx.x % CHUNKS;
  const char* k = (const char*)buf + ((size_t)head * KEYS + chunk * CHUNK_KEYS) * DB;
  const char* v = k + HALF;
  uint32_t acc = 0;
  constexpr int PER = TILE * DB / 16 / 128;  // 16-byte loads a thread a tile, of K (and of V)
  uint4 a[2][PER], b[2][PER];
  #pragma unroll
  for (int i = 0; i < PER; i++) { a[0][i] = __ldg((const uint4*)(k) + i * 128 + threadIdx.x); b[0][i] = __ldg((const uint4*)(v) + i * 128 + threadIdx.x); }
  for (int t = 0; t < CHUNK_KEYS / TILE; t += 2) {
    #pragma unroll
    for (int i = 0; i < PER; i++) if (t + 1 < CHUNK_KEYS / TILE) { a[1][i] = __ldg((const uint4*)(k + (t + 1) * TILE * DB) + i * 128 + threadIdx.x); b[1][i] = __ldg((const uint4*)(v + (t + 1) * TILE * DB) + i * 128 + threadIdx.x); }
    #pragma unroll
    for (int i = 0; i < PER; i++) acc ^= x4(a[0][i]) ^ x4(b[0][i]);
    #pragma unroll
    for (int i = 0; i < PER; i++) if (t + 2 < CHUNK_KEYS / TILE) { a[0][i] = __ldg((const uint4*)(k + (t + 2) * TILE * DB) + i * 128 + threadIdx.x); b[0][i] = __ldg((const uint4*)(v + (t + 2) * TILE * DB) + i * 128 + threadIdx.x); }
    #pragma unroll
    for (int i = 0; i < PER; i++) if (t + 1 < CHUNK_KEYS / TILE) acc ^= x4(a[1][i]) ^ x4(b[1][i]);
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
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
    asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2) : "memory");
    int st = t % STAGES;
    #pragma unroll
    for (int j = 0; j < 2 * PER; j++) acc ^= x4(ring[(st * 2 * PER + j) * 128 + threadIdx.x]);
    issue(t + STAGES - 1);
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  return acc;
}

template <int TILE, int STAGES>
__global__ void __launch_bounds__(128) cpasync_read(const uint4* __restrict__ buf, uint32_t* out) {
  extern __shared__ uint4 ring[];
  uint32_t acc = ring_read<TILE, STAGES, CHUNKS>(buf, ring);
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

// one thread issues each tile's K and V as two bulk copies; the CTA waits on the stage's mbarrier;
// a stage is refilled after a CTA barrier (every thread has read it)
template <int TILE, int STAGES>
__global__ void __launch_bounds__(128) bulk_read(const uint4* __restrict__ buf, uint32_t* out) {
  extern __shared__ uint4 ring[];
  __shared__ __align__(8) uint64_t full[STAGES];
  int head = blockIdx.x / CHUNKS, chunk = blockIdx.x % CHUNKS;
  const char* k = (const char*)buf + ((size_t)head * KEYS + chunk * CHUNK_KEYS) * DB;
  const char* v = k + HALF;
  constexpr int PER = TILE * DB / 16 / 128, NT = CHUNK_KEYS / TILE, BYTES = TILE * DB;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int t) {
    if (threadIdx.x == 0 && t < NT) {
      int st = t % STAGES;
      mbar_expect(&full[st], 2 * BYTES);
      bulk(&ring[st * 2 * PER * 128], k + t * BYTES, BYTES, &full[st]);
      bulk(&ring[(st * 2 + 1) * PER * 128], v + t * BYTES, BYTES, &full[st]);
    }
  };
  for (int t = 0; t < STAGES; t++) issue(t);
  uint32_t acc = 0;
  for (int t = 0; t < NT; t++) {
    int st = t % STAGES;
    mbar_wait(&full[st], (t / STAGES) & 1);
    #pragma unroll
    for (int i = 0; i < 2 * PER; i++) acc ^= x4(ring[(st * 2 * PER + i) * 128 + threadIdx.x]);
    __syncthreads();
    issue(t + STAGES);
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}


template <int TILE, int STAGES>
__global__ void __launch_bounds__(128) cpasync_seq(const uint4* __restrict__ buf, uint32_t* out) {
  extern __shared__ uint4 ring[];
  uint32_t acc = ring_read<TILE, STAGES, CHUNKS, true>(buf, ring);
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(256) grid_stride(const uint4* __restrict__ buf, uint32_t* out, long long n) {
  uint32_t acc = 0;
  for (long long i = (long long)blockIdx.x * 256 * 4 + threadIdx.x; i < n; i += (long long)gridDim.x * 256 * 4) {
    uint4 a[4];
    #pragma unroll
    for (int u = 0; u < 4; u++) a[u] = i + u * 256 < n ? __ldg(buf + i + u * 256) : make_uint4(0, 0, 0, 0);
    #pragma unroll
    for (int u = 0; u < 4; u++) acc ^= x4(a[u]);
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}


// ---- the merge: a CTA per (head, chunk) streams its chunk (a cp.async ring of 32-key tiles, 3
// ---- stages) into a stand-in partial result (max, sum, 128 values); then (none) each writes it only;
// ---- (ticket) each writes it and takes a ticket with atom.acq_rel.gpu, the head's last CTA loads all
// ---- and merges; (ordered) the head's CTA that starts last waits for the others' counts and merges;
// ---- (cluster) the head's C CTAs are a thread-block cluster: partials in shared memory,
// ---- a cluster barrier, rank 0 reads them over distributed shared memory and merges, a second barrier
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
__device__ __forceinline__ void merge_head(const float* part, float* out, int* tickets, int head) {
  const float* hp = part + (size_t)head * C * (D + 2);
  float m[C], l[C], o[C];
  #pragma unroll
  for (int c = 0; c < C; c++) { m[c] = hp[c * (D + 2)]; l[c] = hp[c * (D + 2) + 1]; o[c] = hp[c * (D + 2) + 2 + threadIdx.x]; }
  out[head * D + threadIdx.x] = merged<C>(m, l, o);
  if (threadIdx.x == 0) tickets[head] = 0;
}

template <int C>
__global__ void __launch_bounds__(128) step_none(const uint4* __restrict__ buf, float* part, float* out, int* tickets) {
  extern __shared__ uint4 ring[];
  float x = stream_chunk<C>(buf, ring);
  write_partial(part + (size_t)blockIdx.x * (D + 2), x);
}

template <int C>
__global__ void __launch_bounds__(128) step_ticket(const uint4* __restrict__ buf, float* part, float* out, int* tickets) {
  extern __shared__ uint4 ring[];
  __shared__ int last;
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
  merge_head<C>(part, out, tickets, head);
}

// the head's CTA that starts last merges: each CTA takes its place in the order of starts first (the
// counter's high half; the answer is used only at the end), writes its partial and, but for the last
// to start, counts it done with a release and no answer (the low half) and leaves; the last waits
// for the others' counts (they started before it, so they finish) and merges
template <int C>
__global__ void __launch_bounds__(128) step_ordered(const uint4* __restrict__ buf, float* part, float* out, int* tickets) {
  extern __shared__ uint4 ring[];
  __shared__ int last;
  int head = blockIdx.x / C, order = 0;
  if (threadIdx.x == 0) asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], 65536;" : "=r"(order) : "l"(tickets + head) : "memory");
  float x = stream_chunk<C>(buf, ring);
  write_partial(part + (size_t)blockIdx.x * (D + 2), x);
  __syncthreads();
  if (threadIdx.x == 0) {
    last = (order >> 16) == C - 1;
    if (last) {
      int seen;
      do { asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(tickets + head) : "memory"); } while ((seen & 0xFFFF) != C - 1);
    } else {
      asm volatile("red.release.gpu.global.add.s32 [%0], 1;" :: "l"(tickets + head) : "memory");
    }
  }
  __syncthreads();
  if (!last) return;
  merge_head<C>(part, out, tickets, head);
}

template <int C>
__global__ void __launch_bounds__(128) step_cluster(const uint4* __restrict__ buf, float* part, float* out, int* tickets) {
  extern __shared__ uint4 ring[];
  __shared__ float mine[D + 2];
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

void read_form(const char* name, ReadKernel f, int threads, int grid, int smem, const std::vector<uint4*>& bufs, uint32_t* out) {
  if (smem) CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  report(name, time_graph([&](cudaStream_t s, int c) { f<<<grid, threads, smem, s>>>(bufs[c], out); }, (int)bufs.size()));
}

void read_forms(const std::vector<uint4*>& bufs, uint32_t* out) {
  const int grid = HEADS * CHUNKS;
  read_form("ldg, two register sets, tiles of 16 keys", ldg_read<16>, 128, grid, 0, bufs, out);
  read_form("ldg, two register sets, tiles of 32 keys", ldg_read<32>, 128, grid, 0, bufs, out);
  read_form("cp.async ring, 16 keys x 4 stages", cpasync_read<16, 4>, 128, grid, 4 * 2 * 16 * DB, bufs, out);
  read_form("cp.async ring, 32 keys x 3 stages", cpasync_read<32, 3>, 128, grid, 3 * 2 * 32 * DB, bufs, out);
  read_form("cp.async.bulk, 16 keys x 4 stages", bulk_read<16, 4>, 128, grid, 4 * 2 * 16 * DB, bufs, out);
  read_form("cp.async.bulk, 32 keys x 3 stages", bulk_read<32, 3>, 128, grid, 3 * 2 * 32 * DB, bufs, out);
  read_form("cp.async ring, K then V, 32 keys x 3 stages", cpasync_seq<32, 3>, 128, grid, 3 * 2 * 32 * DB, bufs, out);
  for (int ctas : {132 * 4, 132 * 8}) {
    char name[64]; snprintf(name, sizeof name, "grid-stride ldg, %d CTAs of 256", ctas);
    report(name, time_graph([&](cudaStream_t s, int c) { grid_stride<<<ctas, 256, 0, s>>>(bufs[c], out, (long long)(2 * HALF / 16)); }, (int)bufs.size()));
  }
}

template <int C>
void merge_forms(const std::vector<uint4*>& bufs, float* part, float* out, int* tickets) {
  const int smem = MERGE_STAGES * 2 * MERGE_TILE * DB;
  StepKernel ks[4] = {step_none<C>, step_ticket<C>, step_ordered<C>, step_cluster<C>};
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
  const char* names[4] = {"no merge", "a ticket, the last CTA merges", "the CTA that starts last merges",
                          "a cluster, merged over DSMEM"};
  for (int i = 0; i < 4; i++) {
    char name[80]; snprintf(name, sizeof name, "  %2d chunks, %s", C, names[i]);
    report(name, time_graph([&](cudaStream_t s, int c) {
      cudaLaunchConfig_t cfg = config(s, i == 3);
      CK(cudaLaunchKernelEx(&cfg, ks[i], (const uint4*)bufs[c], part, out, tickets));
    }, (int)bufs.size()));
  }
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "read";
  if (strcmp(mode, "read") && strcmp(mode, "merge")) { printf("usage: %s read|merge\n", argv[0]); return 2; }
  std::vector<uint4*> bufs(3);
  for (auto& p : bufs) { CK(cudaMalloc(&p, 2 * HALF)); CK(cudaMemset(p, 1, 2 * HALF)); }
  uint32_t* sink; CK(cudaMalloc(&sink, 8192 * 4));
  float *part, *out; int* tickets;
  CK(cudaMalloc(&part, HEADS * 16 * (D + 2) * 4)); CK(cudaMalloc(&out, HEADS * D * 4));
  CK(cudaMalloc(&tickets, HEADS * 4)); CK(cudaMemset(tickets, 0, HEADS * 4));
  if (!strcmp(mode, "read")) {
    read_forms(bufs, sink);
  } else {
    merge_forms<16>(bufs, part, out, tickets);
    merge_forms<8>(bufs, part, out, tickets);
    merge_forms<4>(bufs, part, out, tickets);
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
