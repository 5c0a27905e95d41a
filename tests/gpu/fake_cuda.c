/* A fake CUDA driver with host-memory semantics, for testing deepio's loader and GDS engine
 * without a GPU. "Device" memory is malloc'd and recorded in a table; copies are memcpy (the
 * asynchronous ones late, on per-stream threads: below); cuPointerGetAttribute answers from
 * the table. Exports the versioned names libcuda.so.1 exports (cuMemAlloc_v2, ...). Built
 * with -DFAKE_CUDA_OLD it exports only unversioned names, like a driver too old for deepio.
 *
 * Test controls (resolved by tests with dlsym):
 *   deepio_fake_cuda_set_result(name, result, after): the entry point `name` returns `result`
 *     once, after `after` more successful calls; name NULL clears.
 *   deepio_fake_cuda_set_device_count(n), deepio_fake_cuda_live_allocations(),
 *   deepio_fake_cuda_find(ptr, size, &base, &nbytes) (used by the fake cuFile),
 *   deepio_fake_cuda_adopt_all(on): every address but registered host memory is device memory.
 *
 * Contexts: device d (d < 8) has one primary context; each thread has a context stack
 * (cuCtxPushCurrent_v2/cuCtxPopCurrent_v2; cuCtxSetCurrent replaces its top), the current
 * context being its top. Memory allocated (cuMemAlloc_v2, cuMemAllocManaged) while device d's
 * context is current belongs to device d: cuPointerGetAttribute answers DEVICE_ORDINAL d and
 * CONTEXT d's primary context, and IS_MANAGED for managed memory (whose MEMORY_TYPE is
 * DEVICE, as the real driver reports it).
 *
 * Streams are asynchronous, as on a GPU (the part that shows ordering bugs): every stream,
 * and the legacy default stream (handle 0, CU_STREAM_LEGACY 1, CU_STREAM_PER_THREAD 2 all
 * name it here), has its own worker thread that runs the stream's work in order, later than
 * the call that queued it: cuMemcpy{HtoD,DtoH}Async copy when the stream reaches them (after
 * the copy delay, deepio_fake_cuda_set_copy_delay_us), cuEventRecord marks the point an event
 * completes at, cuStreamWaitEvent makes a stream wait until that point of the other stream.
 * cuStreamSynchronize, cuEventSynchronize and cuEventQuery answer accordingly. The synchronous
 * cuMemcpyHtoD/DtoH first wait for the legacy stream, as the real ones do. Not modelled: the
 * implicit synchronisation of blocking streams with the legacy stream.
 *   deepio_fake_cuda_enqueue_fill(stream, ptr, byte, nbytes, delay_us): a "kernel" on `stream`
 *     that, when the stream reaches it, sleeps delay_us and then sets nbytes at ptr to byte
 *     (a producer whose work is still queued); returns 0 or a CUresult. delay_us < 0: the fill
 *     waits instead while fills are held (deepio_fake_cuda_hold_fills), however long that is.
 *   deepio_fake_cuda_hold_fills(hold): 1 holds every fill queued with delay_us < 0 when its
 *     stream reaches it; 0 lets them all run. A test then knows, without a clock, that what
 *     returned while fills were held did not wait for the producer.
 *   deepio_fake_cuda_set_copy_delay_us(us): each asynchronous copy takes at least us.
 *   deepio_fake_cuda_stream_waits(): how many cuStreamWaitEvent calls were made.
 * cuMemcpyDtoDAsync_v2 and cuMemsetD8Async (stream ops too) are exported for tests that play a
 * producer the same way on the real driver; deepio does not use them. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <pthread.h>
#include <time.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { MAX_ALLOCS = 4096 };
struct alloc {
  uintptr_t base;
  size_t nbytes;
  int host_registered;
  int device;  /* the device whose context was current when it was made */
  int managed; /* cuMemAllocManaged */
};
static struct alloc allocs[MAX_ALLOCS];
static int device_count = 1;
static char fail_name[64];
static CUresult fail_result;
static int fail_after;
static int ctx_storage[8];
static int ctx_refs[8];
/* The per-thread context stack, found through a pthread key rather than __thread: a dlopen'ed
 * library's dynamic TLS is what LeakSanitizer's exit-time scan mis-walks with this toolchain
 * (GCC 12, glibc 2.36: "Tracer caught signal 11" on a bogus DTLS range, depending on the
 * binary's layout), which failed the ASan run of tests that passed. The stacks live in a static
 * table (nothing for LeakSanitizer to miss); the key holds slot + 1 and frees the slot when
 * the thread exits. */
enum { MAX_THREADS = 1024, MAX_DEPTH = 16 };
struct ctx_stack {
  int used;
  int depth;
  void* ctx[MAX_DEPTH];
};
static struct ctx_stack stacks[MAX_THREADS]; /* guarded by lock for `used` */
static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void free_stack(void* v) {
  pthread_mutex_lock(&lock);
  stacks[(uintptr_t)v - 1].used = 0;
  pthread_mutex_unlock(&lock);
}
static void make_ctx_key(void) { (void)pthread_key_create(&ctx_key, free_stack); }
/* The calling thread's stack; NULL when it has none and `create` is 0 (or the table is full). */
static struct ctx_stack* my_stack(int create) {
  pthread_once(&ctx_once, make_ctx_key);
  uintptr_t v = (uintptr_t)pthread_getspecific(ctx_key);
  if (v != 0) return &stacks[v - 1];
  if (!create) return NULL;
  struct ctx_stack* st = NULL;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_THREADS; ++i) {
    if (!stacks[i].used) {
      stacks[i].used = 1;
      stacks[i].depth = 0;
      st = &stacks[i];
      (void)pthread_setspecific(ctx_key, (void*)(uintptr_t)(i + 1));
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return st;
}
static void* get_current_ctx(void) {
  struct ctx_stack* st = my_stack(0);
  return st != NULL && st->depth > 0 ? st->ctx[st->depth - 1] : NULL;
}
/* The device whose primary context is current (0 when none is). */
static int current_device(void) {
  int* c = (int*)get_current_ctx();
  return c >= &ctx_storage[0] && c < &ctx_storage[8] ? (int)(c - ctx_storage) : 0;
}
/* cuCtxSetCurrent: replaces the top of the stack; NULL pops it. 0, or 2 when out of slots. */
static int set_current_ctx(void* ctx) {
  struct ctx_stack* st = my_stack(ctx != NULL);
  if (st == NULL) return ctx == NULL ? 0 : 2;
  if (ctx == NULL) {
    if (st->depth > 0) --st->depth;
  } else if (st->depth == 0) {
    st->ctx[st->depth++] = ctx;
  } else {
    st->ctx[st->depth - 1] = ctx;
  }
  return 0;
}

static CUresult injected(const char* name) {
  CUresult r = 0;
  pthread_mutex_lock(&lock);
  if (fail_name[0] != '\0' && strcmp(fail_name, name) == 0) {
    if (fail_after == 0) {
      r = fail_result;
      fail_name[0] = '\0';
    } else {
      --fail_after;
    }
  }
  pthread_mutex_unlock(&lock);
  return r;
}

static int adopt_all; /* guarded by lock */
static int find_host(uintptr_t p);

/* Every address that is not registered host memory counts as device memory of device 0 (its
 * own allocation): lets the engine's conformance suite run unchanged over the GDS route. */
EXPORT void deepio_fake_cuda_adopt_all(int on) {
  pthread_mutex_lock(&lock);
  adopt_all = on;
  pthread_mutex_unlock(&lock);
}

/* Finds the device allocation holding [p, p+n); returns 1 and its base/size. */
EXPORT int deepio_fake_cuda_find(uintptr_t p, size_t n, uintptr_t* base, size_t* nbytes) {
  int found = 0;
  pthread_mutex_lock(&lock);
  if (adopt_all) {
    pthread_mutex_unlock(&lock);
    if (find_host(p)) return 0;
    if (base) *base = p;
    if (nbytes) *nbytes = n;
    return 1;
  }
  for (int i = 0; i < MAX_ALLOCS; ++i) {
    if (allocs[i].base != 0 && !allocs[i].host_registered && p >= allocs[i].base &&
        p < allocs[i].base + allocs[i].nbytes && n <= allocs[i].base + allocs[i].nbytes - p) {
      if (base) *base = allocs[i].base;
      if (nbytes) *nbytes = allocs[i].nbytes;
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return found;
}

static int find_host(uintptr_t p) {
  int found = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_ALLOCS; ++i) {
    if (allocs[i].base != 0 && allocs[i].host_registered && p >= allocs[i].base &&
        p < allocs[i].base + allocs[i].nbytes) {
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return found;
}

static int record(uintptr_t base, size_t n, int host) {
  int ok = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_ALLOCS; ++i) {
    if (allocs[i].base == 0) {
      allocs[i].base = base;
      allocs[i].nbytes = n;
      allocs[i].host_registered = host;
      allocs[i].device = current_device();
      allocs[i].managed = 0;
      ok = 1;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return ok;
}

static int forget(uintptr_t base, int host) {
  int ok = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_ALLOCS; ++i) {
    if (allocs[i].base == base && allocs[i].host_registered == host) {
      allocs[i].base = 0;
      ok = 1;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return ok;
}

EXPORT void deepio_fake_cuda_set_result(const char* name, CUresult result, int after) {
  pthread_mutex_lock(&lock);
  if (name == NULL) {
    fail_name[0] = '\0';
  } else {
    strncpy(fail_name, name, sizeof fail_name - 1);
    fail_name[sizeof fail_name - 1] = '\0';
  }
  fail_result = result;
  fail_after = after;
  pthread_mutex_unlock(&lock);
}

EXPORT void deepio_fake_cuda_set_device_count(int n) {
  pthread_mutex_lock(&lock);
  device_count = n;
  pthread_mutex_unlock(&lock);
}

EXPORT int deepio_fake_cuda_live_allocations(void) {
  int n = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_ALLOCS; ++i) n += allocs[i].base != 0 && !allocs[i].host_registered;
  pthread_mutex_unlock(&lock);
  return n;
}

EXPORT int deepio_fake_cuda_context_refs(int device) {
  pthread_mutex_lock(&lock);
  int r = device >= 0 && device < 8 ? ctx_refs[device] : -1;
  pthread_mutex_unlock(&lock);
  return r;
}

#define CHECK(name)                 \
  do {                              \
    CUresult inj_ = injected(name); \
    if (inj_ != 0) return inj_;     \
  } while (0)

/* As the real driver: calls that work on a context fail with CUDA_ERROR_INVALID_CONTEXT (201)
 * on a thread that has none current (cuCtxSetCurrent, per thread). */
#define NEEDS_CONTEXT()                        \
  do {                                         \
    if (get_current_ctx() == NULL) return 201; \
  } while (0)

EXPORT CUresult cuInit(unsigned int flags) {
  CHECK("cuInit");
  return flags == 0 ? 0 : 1;
}
EXPORT CUresult cuDriverGetVersion(int* v) {
  CHECK("cuDriverGetVersion");
  *v = 12040;
  return 0;
}
EXPORT CUresult cuDeviceGetCount(int* n) {
  CHECK("cuDeviceGetCount");
  pthread_mutex_lock(&lock);
  *n = device_count;
  pthread_mutex_unlock(&lock);
  return 0;
}
EXPORT CUresult cuDeviceGet(int* dev, int ordinal) {
  CHECK("cuDeviceGet");
  if (ordinal < 0 || ordinal >= device_count || ordinal >= 8) return 101;
  *dev = ordinal;
  return 0;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  CHECK("cuDevicePrimaryCtxRetain");
  if (dev < 0 || dev >= 8) return 101;
  pthread_mutex_lock(&lock);
  ++ctx_refs[dev];
  pthread_mutex_unlock(&lock);
  *ctx = &ctx_storage[dev];
  return 0;
}
static CUresult primary_release(int dev) {
  if (dev < 0 || dev >= 8) return 101;
  CUresult r = 0;
  pthread_mutex_lock(&lock);
  if (ctx_refs[dev] == 0) r = 201;
  else --ctx_refs[dev];
  pthread_mutex_unlock(&lock);
  return r;
}
EXPORT CUresult cuCtxSetCurrent(void* ctx) {
  CHECK("cuCtxSetCurrent");
  return set_current_ctx(ctx);
}
EXPORT CUresult cuCtxGetCurrent(void** ctx) {
  *ctx = get_current_ctx();
  return 0;
}
/* The allocation holding p: its index in allocs, or -1. */
static int find_alloc(uintptr_t p) {
  int found = -1;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_ALLOCS; ++i) {
    if (allocs[i].base != 0 && p >= allocs[i].base && p < allocs[i].base + allocs[i].nbytes) {
      found = i;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return found;
}
EXPORT CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr) {
  CHECK("cuPointerGetAttribute");
  const uintptr_t p = (uintptr_t)ptr;
  if (deepio_fake_cuda_find(p, 0, NULL, NULL) || find_host(p)) {
    const int i = find_alloc(p); /* -1: adopted by deepio_fake_cuda_adopt_all (device 0) */
    pthread_mutex_lock(&lock);
    const int host = i >= 0 && allocs[i].host_registered;
    const int device = i >= 0 ? allocs[i].device : 0;
    const int managed = i >= 0 && allocs[i].managed;
    pthread_mutex_unlock(&lock);
    switch (attribute) {
      case 1: *(void**)data = &ctx_storage[device]; return 0; /* CONTEXT */
      case 2: *(unsigned int*)data = host ? 1 : 2; return 0;  /* MEMORY_TYPE: HOST, DEVICE */
      case 8: *(_Bool*)data = managed; return 0;              /* IS_MANAGED: a bool */
      case 9: *(int*)data = device; return 0;                 /* DEVICE_ORDINAL */
      default: return 1;
    }
  }
  return 1; /* CUDA_ERROR_INVALID_VALUE: memory unknown to CUDA */
}

static CUresult alloc_impl(CUdeviceptr* p, size_t n) {
  CHECK("cuMemAlloc");
  NEEDS_CONTEXT();
  if (n == 0) return 1;
  void* m = malloc(n);
  if (m == NULL) return 2;
  memset(m, 0xA5, n);
  if (!record((uintptr_t)m, n, 0)) {
    free(m);
    return 2;
  }
  *p = (CUdeviceptr)(uintptr_t)m;
  return 0;
}
static CUresult free_impl(CUdeviceptr p) {
  CHECK("cuMemFree");
  NEEDS_CONTEXT();
  if (!forget((uintptr_t)p, 0)) return 1;
  free((void*)(uintptr_t)p);
  return 0;
}
static CUresult legacy_sync(void);
static CUresult htod(CUdeviceptr dst, const void* src, size_t n) {
  CHECK("cuMemcpyHtoD");
  NEEDS_CONTEXT();
  if (!deepio_fake_cuda_find((uintptr_t)dst, n, NULL, NULL)) return 1;
  legacy_sync();
  memcpy((void*)(uintptr_t)dst, src, n);
  return 0;
}
static CUresult dtoh(void* dst, CUdeviceptr src, size_t n) {
  CHECK("cuMemcpyDtoH");
  NEEDS_CONTEXT();
  if (!deepio_fake_cuda_find((uintptr_t)src, n, NULL, NULL)) return 1;
  legacy_sync();
  memcpy(dst, (const void*)(uintptr_t)src, n);
  return 0;
}
static CUresult host_register(void* p, size_t n, unsigned int flags) {
  (void)flags;
  CHECK("cuMemHostRegister");
  NEEDS_CONTEXT();
  if (find_host((uintptr_t)p)) return 712;
  return record((uintptr_t)p, n, 1) ? 0 : 2;
}

/* ---- streams and events ----
 * Guarded by qlock; qcond is broadcast whenever a stream's work advances or is queued.
 * A stream is a slot of `streams` (slot 0: the legacy default stream), never freed: an event
 * remembers (slot, generation, position), so an event recorded on a destroyed stream (whose
 * work was finished before its slot was reused) reads as complete instead of touching freed
 * memory. A handle given out is &streams[i]. */
enum { MAX_STREAMS = 256, OP_COPY = 1, OP_FILL = 2, OP_WAIT = 3 };
struct op {
  int kind;
  void* dst;
  const void* src;
  size_t nbytes;
  int byte;
  long delay_us;
  int wait_slot; /* OP_WAIT: until streams[wait_slot] (of wait_gen) has done wait_target ops */
  unsigned wait_gen;
  unsigned long long wait_target;
  struct op* next;
};
struct stream {
  int used;
  unsigned gen;
  int stopping;
  int has_thread;
  pthread_t thread;
  unsigned long long queued; /* ops ever queued */
  unsigned long long done;   /* ops ever finished, in order */
  struct op* head;
  struct op* tail;
};
struct event {
  int kind;
  int recorded;
  int slot;
  unsigned gen;
  unsigned long long target;
};
static struct stream streams[MAX_STREAMS];
static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcond = PTHREAD_COND_INITIALIZER;
static long copy_delay_us; /* guarded by qlock */
static int fills_held;     /* guarded by qlock */
static long stream_waits;  /* guarded by qlock */

static void sleep_us(long us) {
  if (us <= 0) return;
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Under qlock: whether streams[slot] of generation gen has finished its first target ops. */
static int reached(int slot, unsigned gen, unsigned long long target) {
  const struct stream* s = &streams[slot];
  return s->gen != gen || s->done >= target;
}

static void* stream_main(void* arg) {
  struct stream* s = arg;
  pthread_mutex_lock(&qlock);
  for (;;) {
    struct op* o = s->head;
    if (o == NULL) {
      if (s->stopping) break;
      pthread_cond_wait(&qcond, &qlock);
      continue;
    }
    if (o->kind == OP_WAIT && !reached(o->wait_slot, o->wait_gen, o->wait_target)) {
      pthread_cond_wait(&qcond, &qlock);
      continue;
    }
    if (o->kind == OP_FILL && o->delay_us < 0 && fills_held) {
      pthread_cond_wait(&qcond, &qlock);
      continue;
    }
    const long delay = o->kind == OP_COPY ? copy_delay_us : o->delay_us;
    pthread_mutex_unlock(&qlock);
    sleep_us(delay);
    if (o->kind == OP_COPY) memcpy(o->dst, o->src, o->nbytes);
    if (o->kind == OP_FILL) memset(o->dst, o->byte, o->nbytes);
    pthread_mutex_lock(&qlock);
    s->head = o->next;
    if (s->head == NULL) s->tail = NULL;
    ++s->done;
    free(o);
    pthread_cond_broadcast(&qcond);
  }
  pthread_mutex_unlock(&qlock);
  return NULL;
}

/* The slot a stream handle names: 0 for the legacy/per-thread default handles, -1 for junk. */
static int stream_slot(void* handle) {
  const uintptr_t h = (uintptr_t)handle;
  if (h <= 2) return 0;
  const uintptr_t first = (uintptr_t)&streams[0];
  if (h < first || h >= (uintptr_t)&streams[MAX_STREAMS] || (h - first) % sizeof(struct stream) != 0) return -1;
  return (int)((h - first) / sizeof(struct stream));
}

/* Under qlock: starts the stream's thread on first use (the legacy stream's runs for the life
 * of the process, detached). */
static int ensure_thread(int slot) {
  struct stream* s = &streams[slot];
  if (s->has_thread) return 0;
  if (pthread_create(&s->thread, NULL, stream_main, s) != 0) return 2;
  if (slot == 0) pthread_detach(s->thread);
  s->has_thread = 1;
  return 0;
}

/* Queues o on the stream `handle`; frees o and returns a CUresult on failure. */
static CUresult enqueue(void* handle, struct op* o) {
  const int slot = stream_slot(handle);
  if (slot < 0) {
    free(o);
    return 400; /* CUDA_ERROR_INVALID_HANDLE */
  }
  pthread_mutex_lock(&qlock);
  struct stream* s = &streams[slot];
  if (slot != 0 && !s->used) {
    pthread_mutex_unlock(&qlock);
    free(o);
    return 400;
  }
  if (ensure_thread(slot) != 0) {
    pthread_mutex_unlock(&qlock);
    free(o);
    return 2;
  }
  o->next = NULL;
  if (s->tail != NULL) s->tail->next = o;
  else s->head = o;
  s->tail = o;
  ++s->queued;
  pthread_cond_broadcast(&qcond);
  pthread_mutex_unlock(&qlock);
  return 0;
}

static struct op* new_op(int kind) {
  struct op* o = calloc(1, sizeof *o);
  if (o != NULL) o->kind = kind;
  return o;
}

/* Waits until the stream has run everything queued on it so far. */
static CUresult stream_sync(void* handle) {
  const int slot = stream_slot(handle);
  if (slot < 0) return 400;
  pthread_mutex_lock(&qlock);
  struct stream* s = &streams[slot];
  const unsigned gen = s->gen;
  const unsigned long long target = s->queued;
  while (!reached(slot, gen, target)) pthread_cond_wait(&qcond, &qlock);
  pthread_mutex_unlock(&qlock);
  return 0;
}
static CUresult legacy_sync(void) { return stream_sync(NULL); }

static CUresult copy_async(void* dst, const void* src, size_t n, void* stream) {
  struct op* o = new_op(OP_COPY);
  if (o == NULL) return 2;
  o->dst = dst;
  o->src = src;
  o->nbytes = n;
  return enqueue(stream, o);
}

EXPORT CUresult deepio_fake_cuda_enqueue_fill(void* stream, uintptr_t ptr, int byte, size_t nbytes, long delay_us) {
  if (!deepio_fake_cuda_find(ptr, nbytes, NULL, NULL)) return 1;
  struct op* o = new_op(OP_FILL);
  if (o == NULL) return 2;
  o->dst = (void*)ptr;
  o->byte = byte;
  o->nbytes = nbytes;
  o->delay_us = delay_us;
  return enqueue(stream, o);
}

EXPORT void deepio_fake_cuda_hold_fills(int hold) {
  pthread_mutex_lock(&qlock);
  fills_held = hold;
  pthread_cond_broadcast(&qcond);
  pthread_mutex_unlock(&qlock);
}

EXPORT void deepio_fake_cuda_set_copy_delay_us(long us) {
  pthread_mutex_lock(&qlock);
  copy_delay_us = us;
  pthread_mutex_unlock(&qlock);
}

EXPORT long deepio_fake_cuda_stream_waits(void) {
  pthread_mutex_lock(&qlock);
  const long n = stream_waits;
  pthread_mutex_unlock(&qlock);
  return n;
}

#ifdef FAKE_CUDA_OLD
#define V2(name) name
#else
#define V2(name) name##_v2
#endif

EXPORT CUresult V2(cuDevicePrimaryCtxRelease)(int dev) { return primary_release(dev); }
EXPORT CUresult V2(cuMemAlloc)(CUdeviceptr* p, size_t n) { return alloc_impl(p, n); }
EXPORT CUresult V2(cuMemFree)(CUdeviceptr p) { return free_impl(p); }
EXPORT CUresult V2(cuMemcpyHtoD)(CUdeviceptr d, const void* s, size_t n) { return htod(d, s, n); }
EXPORT CUresult V2(cuMemcpyDtoH)(void* d, CUdeviceptr s, size_t n) { return dtoh(d, s, n); }
EXPORT CUresult V2(cuMemcpyHtoDAsync)(CUdeviceptr d, const void* s, size_t n, void* st) {
  CHECK("cuMemcpyHtoD");
  NEEDS_CONTEXT();
  if (!deepio_fake_cuda_find((uintptr_t)d, n, NULL, NULL)) return 1;
  return copy_async((void*)(uintptr_t)d, s, n, st);
}
EXPORT CUresult V2(cuMemcpyDtoHAsync)(void* d, CUdeviceptr s, size_t n, void* st) {
  CHECK("cuMemcpyDtoH");
  NEEDS_CONTEXT();
  if (!deepio_fake_cuda_find((uintptr_t)s, n, NULL, NULL)) return 1;
  return copy_async(d, (const void*)(uintptr_t)s, n, st);
}
/* Not used by deepio; tests play a producer with them on either driver. */
EXPORT CUresult V2(cuMemcpyDtoDAsync)(CUdeviceptr d, CUdeviceptr s, size_t n, void* st) {
  CHECK("cuMemcpyDtoD");
  NEEDS_CONTEXT();
  if (!deepio_fake_cuda_find((uintptr_t)d, n, NULL, NULL) || !deepio_fake_cuda_find((uintptr_t)s, n, NULL, NULL)) {
    return 1;
  }
  return copy_async((void*)(uintptr_t)d, (const void*)(uintptr_t)s, n, st);
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char value, size_t n, void* st) {
  NEEDS_CONTEXT();
  return deepio_fake_cuda_enqueue_fill(st, (uintptr_t)d, value, n, 0);
}
EXPORT CUresult V2(cuMemHostRegister)(void* p, size_t n, unsigned int f) { return host_register(p, n, f); }
/* The real driver returns at once and finishes the stream's queued work later; here the call
 * waits for the stream's thread to finish it and end (no caller relies on the difference).
 * The slot is reused only after that. */
EXPORT CUresult V2(cuStreamDestroy)(void* handle) {
  const int slot = stream_slot(handle);
  if (slot <= 0) return 400;
  pthread_mutex_lock(&qlock);
  struct stream* s = &streams[slot];
  if (!s->used) {
    pthread_mutex_unlock(&qlock);
    return 400;
  }
  const int joined = s->has_thread;
  const pthread_t thread = s->thread;
  s->stopping = 1;
  pthread_cond_broadcast(&qcond);
  pthread_mutex_unlock(&qlock);
  if (joined) pthread_join(thread, NULL);
  pthread_mutex_lock(&qlock);
  ++s->gen; /* events recorded on it now read as complete */
  s->used = 0;
  s->stopping = 0;
  s->has_thread = 0;
  s->queued = s->done = 0;
  pthread_cond_broadcast(&qcond);
  pthread_mutex_unlock(&qlock);
  return 0;
}
EXPORT CUresult V2(cuEventDestroy)(void* e) {
  free(e);
  return 0;
}

EXPORT CUresult cuMemHostUnregister(void* p) {
  CHECK("cuMemHostUnregister");
  NEEDS_CONTEXT();
  return forget((uintptr_t)p, 1) ? 0 : 713;
}
EXPORT CUresult cuStreamCreate(void** out, unsigned int flags) {
  (void)flags;
  CHECK("cuStreamCreate");
  NEEDS_CONTEXT();
  pthread_mutex_lock(&qlock);
  for (int i = 1; i < MAX_STREAMS; ++i) {
    if (!streams[i].used) {
      streams[i].used = 1;
      *out = &streams[i];
      pthread_mutex_unlock(&qlock);
      return 0;
    }
  }
  pthread_mutex_unlock(&qlock);
  return 2;
}
EXPORT CUresult cuStreamSynchronize(void* s) {
  CHECK("cuStreamSynchronize");
  NEEDS_CONTEXT();
  return stream_sync(s);
}
EXPORT CUresult cuEventCreate(void** out, unsigned int flags) {
  (void)flags;
  CHECK("cuEventCreate");
  NEEDS_CONTEXT();
  struct event* e = calloc(1, sizeof *e);
  if (e == NULL) return 2;
  e->kind = 2;
  *out = e;
  return 0;
}
EXPORT CUresult cuEventRecord(void* ev, void* handle) {
  CHECK("cuEventRecord");
  NEEDS_CONTEXT();
  struct event* e = ev;
  const int slot = stream_slot(handle);
  if (e == NULL || slot < 0) return 400;
  pthread_mutex_lock(&qlock);
  if (slot != 0 && !streams[slot].used) {
    pthread_mutex_unlock(&qlock);
    return 400;
  }
  e->recorded = 1;
  e->slot = slot;
  e->gen = streams[slot].gen;
  e->target = streams[slot].queued;
  pthread_mutex_unlock(&qlock);
  return 0;
}
/* Under qlock. An event never recorded counts as complete, as on the real driver. */
static int event_done(const struct event* e) { return !e->recorded || reached(e->slot, e->gen, e->target); }
EXPORT CUresult cuEventQuery(void* ev) {
  CHECK("cuEventQuery");
  NEEDS_CONTEXT();
  if (ev == NULL) return 400;
  pthread_mutex_lock(&qlock);
  const int done = event_done(ev);
  pthread_mutex_unlock(&qlock);
  return done ? 0 : 600;
}
EXPORT CUresult cuEventSynchronize(void* ev) {
  CHECK("cuEventSynchronize");
  NEEDS_CONTEXT();
  if (ev == NULL) return 400;
  pthread_mutex_lock(&qlock);
  while (!event_done(ev)) pthread_cond_wait(&qcond, &qlock);
  pthread_mutex_unlock(&qlock);
  return 0;
}
EXPORT CUresult cuStreamWaitEvent(void* handle, void* ev, unsigned int flags) {
  CHECK("cuStreamWaitEvent");
  NEEDS_CONTEXT();
  const struct event* e = ev;
  if (e == NULL || flags != 0) return 1;
  struct op* o = new_op(OP_WAIT);
  if (o == NULL) return 2;
  pthread_mutex_lock(&qlock);
  ++stream_waits;
  if (e->recorded) {
    o->wait_slot = e->slot;
    o->wait_gen = e->gen;
    o->wait_target = e->target;
  } else {
    o->wait_slot = 0; /* never recorded: nothing to wait for */
    o->wait_gen = streams[0].gen;
    o->wait_target = 0;
  }
  pthread_mutex_unlock(&qlock);
  return enqueue(handle, o);
}
/* ---- context stack, managed memory ---- */
EXPORT CUresult V2(cuCtxPushCurrent)(void* ctx) {
  CHECK("cuCtxPushCurrent");
  if (ctx == NULL) return 1;
  struct ctx_stack* st = my_stack(1);
  if (st == NULL || st->depth == MAX_DEPTH) return 2;
  st->ctx[st->depth++] = ctx;
  return 0;
}
EXPORT CUresult V2(cuCtxPopCurrent)(void** ctx) {
  CHECK("cuCtxPopCurrent");
  struct ctx_stack* st = my_stack(0);
  if (st == NULL || st->depth == 0) return 201;
  void* top = st->ctx[--st->depth];
  if (ctx != NULL) *ctx = top;
  return 0;
}
/* The calling thread's context stack depth (tests: nothing left pushed). */
EXPORT int deepio_fake_cuda_context_depth(void) {
  struct ctx_stack* st = my_stack(0);
  return st != NULL ? st->depth : 0;
}
/* Managed memory: host-addressable; MEMORY_TYPE DEVICE and IS_MANAGED as the real driver. */
EXPORT CUresult cuMemAllocManaged(CUdeviceptr* p, size_t n, unsigned int flags) {
  (void)flags;
  CUresult r = alloc_impl(p, n);
  if (r != 0) return r;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_ALLOCS; ++i) {
    if (allocs[i].base == (uintptr_t)*p && !allocs[i].host_registered) allocs[i].managed = 1;
  }
  pthread_mutex_unlock(&lock);
  return 0;
}

EXPORT CUresult cuGetErrorName(CUresult r, const char** s) {
  switch (r) {
    case 0: *s = "CUDA_SUCCESS"; return 0;
    case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
    case 700: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; return 0;
    default: *s = NULL; return 1;
  }
}
EXPORT CUresult cuGetErrorString(CUresult r, const char** s) {
  switch (r) {
    case 0: *s = "no error"; return 0;
    case 1: *s = "invalid argument"; return 0;
    case 2: *s = "out of memory"; return 0;
    case 100: *s = "no CUDA-capable device is detected"; return 0;
    case 101: *s = "invalid device ordinal"; return 0;
    case 201: *s = "invalid device context"; return 0;
    case 700: *s = "an illegal memory access was encountered (fake)"; return 0;
    default: *s = NULL; return 1;
  }
}
