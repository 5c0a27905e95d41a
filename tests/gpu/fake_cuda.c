/* A fake CUDA driver with host-memory semantics, for testing deepio's loader and GDS engine
 * without a GPU. "Device" memory is malloc'd and recorded in a table; copies are memcpy;
 * streams and events are trivial; cuPointerGetAttribute answers from the table. Exports the
 * versioned names libcuda.so.1 exports (cuMemAlloc_v2, ...). Built with -DFAKE_CUDA_OLD it
 * exports only unversioned names, like a driver too old for deepio.
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
 * DEVICE, as the real driver reports it). */
#include <pthread.h>
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
static CUresult htod(CUdeviceptr dst, const void* src, size_t n) {
  CHECK("cuMemcpyHtoD");
  NEEDS_CONTEXT();
  if (!deepio_fake_cuda_find((uintptr_t)dst, n, NULL, NULL)) return 1;
  memcpy((void*)(uintptr_t)dst, src, n);
  return 0;
}
static CUresult dtoh(void* dst, CUdeviceptr src, size_t n) {
  CHECK("cuMemcpyDtoH");
  NEEDS_CONTEXT();
  if (!deepio_fake_cuda_find((uintptr_t)src, n, NULL, NULL)) return 1;
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

struct object {
  int kind;
};
static CUresult object_create(void** out, int kind) {
  struct object* o = malloc(sizeof *o);
  if (o == NULL) return 2;
  o->kind = kind;
  *out = o;
  return 0;
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
  (void)st;
  return htod(d, s, n);
}
EXPORT CUresult V2(cuMemcpyDtoHAsync)(void* d, CUdeviceptr s, size_t n, void* st) {
  (void)st;
  return dtoh(d, s, n);
}
EXPORT CUresult V2(cuMemHostRegister)(void* p, size_t n, unsigned int f) { return host_register(p, n, f); }
EXPORT CUresult V2(cuStreamDestroy)(void* s) {
  free(s);
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
EXPORT CUresult cuStreamCreate(void** s, unsigned int flags) {
  (void)flags;
  CHECK("cuStreamCreate");
  NEEDS_CONTEXT();
  return object_create(s, 1);
}
EXPORT CUresult cuStreamSynchronize(void* s) {
  (void)s;
  CHECK("cuStreamSynchronize");
  NEEDS_CONTEXT();
  return 0;
}
EXPORT CUresult cuEventCreate(void** e, unsigned int flags) {
  (void)flags;
  CHECK("cuEventCreate");
  NEEDS_CONTEXT();
  return object_create(e, 2);
}
EXPORT CUresult cuEventRecord(void* e, void* s) {
  (void)e;
  (void)s;
  CHECK("cuEventRecord");
  NEEDS_CONTEXT();
  return 0;
}
EXPORT CUresult cuEventQuery(void* e) {
  (void)e;
  CHECK("cuEventQuery");
  NEEDS_CONTEXT();
  return 0;
}
EXPORT CUresult cuEventSynchronize(void* e) {
  (void)e;
  CHECK("cuEventSynchronize");
  NEEDS_CONTEXT();
  return 0;
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
