// The probe's read forms (included by decode_stream_probe.cu after its helpers, ring_read and
// time_graph): each CTA a chunk of K and of V in a load form, the cache in equal runs of keys, or a
// head's keys taken by its CTAs in granules from a counter.

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

template <int TILE, int STAGES>
__global__ void __launch_bounds__(128) cpasync_read(const uint4* __restrict__ buf, uint32_t* out) {
  extern __shared__ __align__(128) uint4 ring[];
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
  extern __shared__ __align__(128) uint4 ring[];
  uint64_t* full = past<uint64_t>(ring, STAGES * 2 * TILE * DB);
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
  extern __shared__ __align__(128) uint4 ring[];
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


// ---- balance: the cache cut into equal runs of keys, one a CTA, head boundaries ignored (a read
// ---- only), so that every SM streams the same bytes when the CTAs are a multiple of the SMs; each
// ---- CTA's thread 0 may record its SM and when it started and ended
struct CtaSpan { unsigned long long start, end; unsigned sm, pad; };
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
  return t;
}
// (thread 0) the CTA's span, from ``t0``, its SM and ``pad`` recorded
__device__ __forceinline__ void record_span(CtaSpan* spans, unsigned long long t0, unsigned pad) {
  unsigned long long t1 = global_ns();
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  spans[blockIdx.x] = {t0, t1, sm, pad};
}
template <int TILE, int STAGES>
__global__ void __launch_bounds__(128) flat_read(const uint4* __restrict__ buf, uint32_t* out, CtaSpan* spans) {
  extern __shared__ __align__(128) uint4 ring[];
  const unsigned long long t0 = global_ns();
  const long long total = (long long)HEADS * KEYS;
  const long long k0 = total * blockIdx.x / gridDim.x, k1 = total * (blockIdx.x + 1) / gridDim.x;
  constexpr int PER = TILE * DB / 16 / 128;
  const int nt = (int)((k1 - k0 + TILE - 1) / TILE);
  const char* k = (const char*)buf + k0 * DB;
  const char* v = k + HALF;
  auto issue = [&](int t) {
    int st = t % STAGES;
    #pragma unroll
    for (int j = 0; j < 2 * PER; j++) {
      int piece = (j % PER) * 128 + threadIdx.x, key = t * TILE + piece * 16 / DB;
      if (t < nt && k0 + key < k1)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_addr(&ring[(st * 2 * PER + j) * 128 + threadIdx.x])),
                     "l"((j < PER ? k : v) + (size_t)t * TILE * DB + piece * 16));
    }
    asm volatile("cp.async.commit_group;");
  };
  uint32_t acc = 0;
  for (int t = 0; t < STAGES - 1; t++) issue(t);
  for (int t = 0; t < nt; t++) {
    ring_step<STAGES, PER>(ring, t, acc, issue);
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
  if (spans && threadIdx.x == 0) record_span(spans, t0, 0);
}

// one launch recorded: the cache's three copies read first (the last leaves L2 cold for the first),
// then ``launch()`` (on copy 0, into ``spans``); the spans of its ``ctas`` CTAs
template <typename F>
std::vector<CtaSpan> recorded_launch(F launch, int ctas, CtaSpan* spans, const std::vector<uint4*>& bufs, uint32_t* out) {
  for (int c = 0; c < 3; c++) flat_read<16, 3><<<ctas, 128, 3 * 2 * 16 * DB>>>(bufs[c], out, nullptr);
  launch();
  CK(cudaDeviceSynchronize());
  std::vector<CtaSpan> h(ctas);
  CK(cudaMemcpy(h.data(), spans, ctas * sizeof(CtaSpan), cudaMemcpyDeviceToHost));
  return h;
}

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
  read_form("cp.async.bulk, 16 keys x 4 stages", bulk_read<16, 4>, 128, grid, 4 * 2 * 16 * DB + 64, bufs, out);
  read_form("cp.async.bulk, 32 keys x 3 stages", bulk_read<32, 3>, 128, grid, 3 * 2 * 32 * DB + 64, bufs, out);
  read_form("cp.async ring, K then V, 32 keys x 3 stages", cpasync_seq<32, 3>, 128, grid, 3 * 2 * 32 * DB, bufs, out);
  for (int ctas : {132 * 4, 132 * 8}) {
    char name[64]; snprintf(name, sizeof name, "grid-stride ldg, %d CTAs of 256", ctas);
    report(name, time_graph([&](cudaStream_t s, int c) { grid_stride<<<ctas, 256, 0, s>>>(bufs[c], out, (long long)(2 * HALF / 16)); }, (int)bufs.size()));
  }
}

// the static chunks (16 a head, as the step's) and equal runs at 4 and 8 CTAs an SM, timed; then one
// launch of each recorded: the CTAs' end times by how many CTAs their SM held
void balance_forms(const std::vector<uint4*>& bufs, uint32_t* out) {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int smem = 3 * 2 * 16 * DB;
  CK(cudaFuncSetAttribute(flat_read<16, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(cpasync_read<16, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CtaSpan* spans; CK(cudaMalloc(&spans, 16 * sms * sizeof(CtaSpan)));
  for (int r = 0; r < 2; r++) {
    read_form("16 chunks a head (512 CTAs), 16 keys x 3", cpasync_read<16, 3>, 128, HEADS * CHUNKS, smem, bufs, out);
    for (int ctas : {HEADS * CHUNKS, 4 * sms, 8 * sms}) {
      char name[64]; snprintf(name, sizeof name, "equal runs, %d CTAs, 16 keys x 3", ctas);
      report(name, time_graph([&](cudaStream_t s, int c) { flat_read<16, 3><<<ctas, 128, smem, s>>>(bufs[c], out, nullptr); },
                              (int)bufs.size()));
    }
  }
  for (int ctas : {HEADS * CHUNKS, 4 * sms}) {
    auto h = recorded_launch([&] { flat_read<16, 3><<<ctas, 128, smem>>>(bufs[0], out, spans); }, ctas, spans, bufs, out);
    unsigned long long first = ~0ull, last = 0;
    std::vector<int> held(sms, 0);
    for (auto& x : h) { first = std::min(first, x.start); last = std::max(last, x.end); held[x.sm]++; }
    printf("equal runs, %d CTAs, one launch: %.2f us from the first start to the last end\n", ctas, (last - first) / 1e3);
    for (int n = 1; n <= 8; n++) {
      std::vector<double> ends;
      for (auto& x : h) if (held[x.sm] == n) ends.push_back((x.end - first) / 1e3);
      if (ends.empty()) continue;
      std::sort(ends.begin(), ends.end());
      double mean = 0; for (double e : ends) mean += e;
      printf("  SMs holding %d CTAs: %3zu CTAs, ends at %.2f / %.2f / %.2f us (first, mean, last)\n", n, ends.size(),
             ends.front(), mean / ends.size(), ends.back());
    }
  }
  CK(cudaFree(spans));
}

// ---- steal: the 16 CTAs of a head take its keys in granules of G tiles from a counter of the
// ---- head's: the first granule by their chunk, the others by an atomic add, issued a granule ahead
// ---- of its use so that the ring never waits for it. ctr[head] counts the granules taken past the
// ---- first 16, ctr[HEADS + head] the CTAs done; the last CTA of a head sets both back to zero
template <int TILE, int STAGES, int G>
__global__ void __launch_bounds__(128) steal_read(const uint4* __restrict__ buf, uint32_t* out, int* ctr, CtaSpan* spans) {
  extern __shared__ __align__(128) uint4 ring[];
  int* gid = past<int>(ring, STAGES * 2 * TILE * DB);  // the granules of the last four, by granule % 4
  const unsigned long long t0 = global_ns();
  constexpr int PER = TILE * DB / 16 / 128, NG = KEYS / (G * TILE);
  static_assert(G >= STAGES - 1 && NG >= CHUNKS, "a granule's id is needed one granule ahead at most");
  const int head = blockIdx.x / CHUNKS, chunk = blockIdx.x % CHUNKS;
  const char* k = (const char*)buf + (size_t)head * KEYS * DB;
  const char* v = k + HALF;
  int pending = 0;  // (thread 0) the granule after the next, while its atomic is in flight
  if (threadIdx.x == 0) { gid[0] = chunk; pending = CHUNKS + atomicAdd(&ctr[head], 1); }
  __syncthreads();
  auto issue = [&](int t) {  // tile t of the CTA's: tile t % G of its granule t / G
    int g = gid[(t / G) % 4], st = t % STAGES;
    #pragma unroll
    for (int j = 0; j < 2 * PER; j++)
      if (g < NG)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_addr(&ring[(st * 2 * PER + j) * 128 + threadIdx.x])),
                     "l"((const uint4*)((j < PER ? k : v) + ((size_t)g * G + t % G) * TILE * DB) + (j % PER) * 128 + threadIdx.x));
    asm volatile("cp.async.commit_group;");
  };
  for (int t = 0; t < STAGES - 1; t++) issue(t);  // (granule 0's: G >= STAGES - 1)
  uint32_t acc = 0;
  int granules = 0;
  for (int t = 0;; t++) {
    if (t % G == 0) {  // granule t / G starts: the next one's id out, the one after it asked for
      if (threadIdx.x == 0) {
        gid[(t / G + 1) % 4] = pending;
        if (pending < NG) pending = CHUNKS + atomicAdd(&ctr[head], 1);
      }
      __syncthreads();
      if (gid[(t / G) % 4] >= NG) break;
      granules++;
    }
    ring_step<STAGES, PER>(ring, t, acc, issue);
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
  if (threadIdx.x == 0) {
    if (pending == -1) out[blockIdx.x] = 0;  // (its atomic done before the CTA counts itself out)
    __threadfence();
    if (atomicAdd(&ctr[HEADS + head], 1) == CHUNKS - 1) { ctr[head] = 0; ctr[HEADS + head] = 0; }
    if (spans) record_span(spans, t0, (unsigned)granules);
  }
}

// the static chunks with the stealing form's ending: each CTA fences its writes and counts itself
// out on its head's counter, the last sets it back to zero (as a merge's ticket would)
template <int TILE, int STAGES>
__global__ void __launch_bounds__(128) chunk_done(const uint4* __restrict__ buf, uint32_t* out, int* ctr, CtaSpan* spans) {
  extern __shared__ __align__(128) uint4 ring[];
  const unsigned long long t0 = global_ns();
  uint32_t acc = ring_read<TILE, STAGES, CHUNKS>(buf, ring);
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    const int head = blockIdx.x / CHUNKS;
    __threadfence();
    if (atomicAdd(&ctr[HEADS + head], 1) == CHUNKS - 1) ctr[HEADS + head] = 0;
    if (spans) record_span(spans, t0, 1);
  }
}

// the spread of one recorded launch's CTA ends (first start to first / mean / last end)
void span_summary(const char* name, const std::vector<CtaSpan>& h) {
  unsigned long long first = ~0ull;
  for (auto& x : h) first = std::min(first, x.start);
  std::vector<double> ends, starts;
  for (auto& x : h) { ends.push_back((x.end - first) / 1e3); starts.push_back((x.start - first) / 1e3); }
  std::sort(ends.begin(), ends.end()); std::sort(starts.begin(), starts.end());
  double mean = 0; for (double e : ends) mean += e;
  printf("  %-40s starts up to %.2f us; ends %.2f / %.2f / %.2f us (first, mean, last)\n", name, starts.back(),
         ends.front(), mean / ends.size(), ends.back());
}

// granules of G tiles of 16 keys taken from a counter: timed, or one launch recorded and checked
// (every granule of every head read once, the counters back at zero)
template <int G>
void steal_form(const std::vector<uint4*>& bufs, uint32_t* out, int* ctr, CtaSpan* spans, bool record) {
  const int smem = 3 * 2 * 16 * DB + 64, grid = HEADS * CHUNKS;
  CK(cudaFuncSetAttribute(steal_read<16, 3, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  char name[64]; snprintf(name, sizeof name, "granules of %d keys from a counter", G * 16);
  if (!record) {
    report(name, time_graph([&](cudaStream_t s, int c) { steal_read<16, 3, G><<<grid, 128, smem, s>>>(bufs[c], out, ctr, nullptr); },
                            (int)bufs.size()));
    return;
  }
  auto h = recorded_launch([&] { steal_read<16, 3, G><<<grid, 128, smem>>>(bufs[0], out, ctr, spans); }, grid, spans, bufs, out);
  std::vector<int> c(2 * HEADS);
  CK(cudaMemcpy(c.data(), ctr, 2 * HEADS * sizeof(int), cudaMemcpyDeviceToHost));
  bool ok = std::all_of(c.begin(), c.end(), [](int x) { return x == 0; });
  int most = 0, least = 1 << 30;
  for (int head = 0; head < HEADS; head++) {
    int n = 0;
    for (int i = 0; i < CHUNKS; i++) { int g = h[head * CHUNKS + i].pad; n += g; most = std::max(most, g); least = std::min(least, g); }
    ok = ok && n == KEYS / (G * 16);
  }
  printf("%s: %s, %d-%d granules a CTA\n", name, ok ? "every granule once, counters zero" : "WRONG", least, most);
  span_summary(name, h);
}

// the static chunks (with and without the stealing form's ending) against granules of 32, 64 and 128
// keys, timed three times; then one launch of each recorded
void steal_forms(const std::vector<uint4*>& bufs, uint32_t* out, int* ctr) {
  const int smem = 3 * 2 * 16 * DB, grid = HEADS * CHUNKS;
  CK(cudaFuncSetAttribute(cpasync_read<16, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(flat_read<16, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(chunk_done<16, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CtaSpan* spans; CK(cudaMalloc(&spans, grid * sizeof(CtaSpan)));
  const char* done = "16 chunks a head, each counted out";
  for (int r = 0; r < 3; r++) {
    read_form("16 chunks a head (512 CTAs), 16 keys x 3", cpasync_read<16, 3>, 128, grid, smem, bufs, out);
    report(done, time_graph([&](cudaStream_t s, int c) { chunk_done<16, 3><<<grid, 128, smem, s>>>(bufs[c], out, ctr, nullptr); },
                            (int)bufs.size()));
    steal_form<2>(bufs, out, ctr, spans, false);
    steal_form<4>(bufs, out, ctr, spans, false);
    steal_form<8>(bufs, out, ctr, spans, false);
  }
  span_summary("equal runs (512 CTAs)",
               recorded_launch([&] { flat_read<16, 3><<<grid, 128, smem>>>(bufs[0], out, spans); }, grid, spans, bufs, out));
  span_summary(done, recorded_launch([&] { chunk_done<16, 3><<<grid, 128, smem>>>(bufs[0], out, ctr, spans); }, grid, spans, bufs, out));
  steal_form<2>(bufs, out, ctr, spans, true);
  steal_form<4>(bufs, out, ctr, spans, true);
  steal_form<8>(bufs, out, ctr, spans, true);
  CK(cudaFree(spans));
}
