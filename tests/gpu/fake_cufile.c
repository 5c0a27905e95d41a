#define _GNU_SOURCE 1 /* O_DIRECT */
/* A fake libcufile over the fake CUDA driver: cuFileRead/Write are pread/pwrite into the
 * fake device memory, with the checks the real library makes (driver open, handle type,
 * device pointers, registrations, ranges). Exports cuFileDriverClose_v2 and
 * cuFileDriverClose like the real library.
 *
 * Test controls (resolved with dlsym):
 *   deepio_fake_cufile_reset()                 clear every control and counter
 *   deepio_fake_cufile_fail_register(err)      cuFileHandleRegister returns err (0: succeed); 5027
 *                                              is what the real library answers without nvidia-fs
 *   deepio_fake_cufile_fail_bufregister(err)   cuFileBufRegister returns err (0: succeed)
 *   deepio_fake_cufile_param_bool(param)       what cuFileSetParameterBool staged (-1: never)
 *   deepio_fake_cufile_fail_open(err)          cuFileDriverOpen returns err
 *   deepio_fake_cufile_fail_io(write, result, err_no, after)  the (after+1)-th read or write
 *                                              returns result (errno = err_no when -1)
 *   deepio_fake_cufile_max_io(n)               transfer at most n bytes per call (short I/O)
 *   deepio_fake_cufile_delay_us(us)            sleep in each read/write (observe parallelism)
 *   deepio_fake_cufile_nvfs_major(v)           nvfs.major_version reported by GetProperties
 *   deepio_fake_cufile_stats(out[8])           opens, closes, open_refs, io_calls, max_io,
 *                                              max_concurrency, registered_buffers, handles
 *   deepio_fake_cufile_last_io(&base, &offset) base pointer and buffer offset of the last I/O
 *   deepio_fake_cufile_handle_register_calls() cuFileHandleRegister calls since the last reset
 *   deepio_fake_cufile_handle_deregister_calls() cuFileHandleDeregister calls (of handles) since
 *                                              the last reset
 *   deepio_fake_cufile_last_deregister(&io, &open)  at the last cuFileHandleDeregister: the
 *                                              io_calls count then, and whether the registered
 *                                              descriptor was still open on the registered file
 *                                              (1) or closed / reused for another file (0)
 *   deepio_fake_cufile_hold_io(on)             1: every cuFileRead/Write waits (after it counts
 *                                              in io_calls) until hold_io(0) releases it
 *   deepio_fake_cufile_io_held()               how many reads/writes wait in hold_io now
 *   deepio_fake_cufile_param_string(param)     what cuFileSetParameterString staged (NULL: never)
 *   deepio_fake_cufile_keep_direct(on)         leave O_DIRECT on registered descriptors (as the
 *                                              real library needs it; fake reads then fail) */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <fcntl.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct {
  int err;
  int cu_err;
} CUfileError_t;
typedef struct {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
} CUfileDescr_t;
typedef struct {
  struct {
    unsigned int major_version, minor_version;
    size_t poll_thresh_size, max_direct_io_size;
    unsigned int dstatusflags, dcontrolflags;
  } nvfs;
  unsigned int fflags, max_device_cache_size, per_buffer_cache_size, max_device_pinned_mem_size, max_batch_io_size,
      max_batch_io_timeout_msecs;
} CUfileDrvProps_t;

int deepio_fake_cuda_find(uintptr_t p, size_t n, uintptr_t* base, size_t* nbytes);

enum { MAX_BUFS = 256 };
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long opens, closes, refs, io_calls, max_io_seen, concurrency, max_concurrency, handles;
static struct {
  uintptr_t base;
  size_t n;
} bufs[MAX_BUFS];
static int register_err, open_err, bufregister_err;
enum { MAX_PARAMS = 16 };
static int bool_params[MAX_PARAMS]; /* -1: never set */
static int bool_params_init;
static int io_fail_write = -1, io_fail_errno, io_fail_after;
static long io_fail_result;
static size_t max_io;
static unsigned delay_us;
static unsigned nvfs_major = 2;
static size_t max_direct_kib;
static long register_calls;
static int keep_direct;
enum { MAX_STRING_PARAMS = 4 };
static char string_params[MAX_STRING_PARAMS][512];
static int string_params_set[MAX_STRING_PARAMS];
static uintptr_t last_base;
static long last_offset;
static long deregister_calls, deregister_io_calls;
static int deregister_fd_open;
static int hold_io;
static long io_held;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;

static CUfileError_t ok(void) {
  CUfileError_t e = {0, 0};
  return e;
}
static CUfileError_t err(int code) {
  CUfileError_t e = {code, 0};
  return e;
}

EXPORT void deepio_fake_cufile_reset(void) {
  pthread_mutex_lock(&lock);
  opens = closes = refs = io_calls = max_io_seen = concurrency = max_concurrency = handles = 0;
  register_calls = 0;
  deregister_calls = deregister_io_calls = 0;
  deregister_fd_open = 0;
  hold_io = 0;
  pthread_cond_broadcast(&hold_cv);
  keep_direct = 0;
  memset(string_params_set, 0, sizeof string_params_set);
  memset(bufs, 0, sizeof bufs);
  register_err = open_err = bufregister_err = 0;
  for (int i = 0; i < MAX_PARAMS; ++i) bool_params[i] = -1;
  bool_params_init = 1;
  io_fail_write = -1;
  max_io = 0;
  delay_us = 0;
  nvfs_major = 2;
  max_direct_kib = 0;
  pthread_mutex_unlock(&lock);
}
EXPORT void deepio_fake_cufile_fail_register(int e) {
  pthread_mutex_lock(&lock);
  register_err = e;
  pthread_mutex_unlock(&lock);
}
EXPORT void deepio_fake_cufile_fail_bufregister(int e) {
  pthread_mutex_lock(&lock);
  bufregister_err = e;
  pthread_mutex_unlock(&lock);
}
/* The value a cuFileSetParameterBool call staged for `param` (-1: never set). */
EXPORT int deepio_fake_cufile_param_bool(int param) {
  pthread_mutex_lock(&lock);
  int v = (bool_params_init && param >= 0 && param < MAX_PARAMS) ? bool_params[param] : -1;
  pthread_mutex_unlock(&lock);
  return v;
}
EXPORT void deepio_fake_cufile_fail_open(int e) {
  pthread_mutex_lock(&lock);
  open_err = e;
  pthread_mutex_unlock(&lock);
}
EXPORT void deepio_fake_cufile_fail_io(int write, long result, int err_no, int after) {
  pthread_mutex_lock(&lock);
  io_fail_write = write;
  io_fail_result = result;
  io_fail_errno = err_no;
  io_fail_after = after;
  pthread_mutex_unlock(&lock);
}
EXPORT void deepio_fake_cufile_max_io(size_t n) {
  pthread_mutex_lock(&lock);
  max_io = n;
  pthread_mutex_unlock(&lock);
}
EXPORT void deepio_fake_cufile_delay_us(unsigned us) {
  pthread_mutex_lock(&lock);
  delay_us = us;
  pthread_mutex_unlock(&lock);
}
EXPORT void deepio_fake_cufile_nvfs_major(unsigned v) {
  pthread_mutex_lock(&lock);
  nvfs_major = v;
  pthread_mutex_unlock(&lock);
}
EXPORT void deepio_fake_cufile_stats(long out[8]) {
  pthread_mutex_lock(&lock);
  long nb = 0;
  for (int i = 0; i < MAX_BUFS; ++i) nb += bufs[i].base != 0;
  out[0] = opens;
  out[1] = closes;
  out[2] = refs;
  out[3] = io_calls;
  out[4] = max_io_seen;
  out[5] = max_concurrency;
  out[6] = nb;
  out[7] = handles;
  pthread_mutex_unlock(&lock);
}
EXPORT void deepio_fake_cufile_last_io(uintptr_t* base, long* offset) {
  pthread_mutex_lock(&lock);
  *base = last_base;
  *offset = last_offset;
  pthread_mutex_unlock(&lock);
}
EXPORT size_t deepio_fake_cufile_max_direct_kib(void) {
  pthread_mutex_lock(&lock);
  size_t v = max_direct_kib;
  pthread_mutex_unlock(&lock);
  return v;
}

EXPORT CUfileError_t cuFileDriverOpen(void) {
  pthread_mutex_lock(&lock);
  int e = open_err;
  if (e == 0) {
    ++opens;
    ++refs;
  }
  pthread_mutex_unlock(&lock);
  return e ? err(e) : ok();
}
EXPORT CUfileError_t cuFileDriverClose_v2(void) {
  pthread_mutex_lock(&lock);
  int bad = refs == 0;
  if (!bad) {
    ++closes;
    --refs;
  }
  pthread_mutex_unlock(&lock);
  return bad ? err(5001) : ok();
}
EXPORT CUfileError_t cuFileDriverClose(void) { return cuFileDriverClose_v2(); }

static int driver_open(void) {
  pthread_mutex_lock(&lock);
  int r = refs > 0;
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUfileError_t cuFileDriverSetMaxDirectIOSize(size_t kib) {
  pthread_mutex_lock(&lock);
  max_direct_kib = kib;
  pthread_mutex_unlock(&lock);
  return kib > 16384 ? err(5003) : ok();
}
EXPORT CUfileError_t cuFileDriverGetProperties(CUfileDrvProps_t* p) {
  if (!driver_open()) return err(5001);
  memset(p, 0, sizeof *p);
  pthread_mutex_lock(&lock);
  p->nvfs.major_version = nvfs_major;
  pthread_mutex_unlock(&lock);
  return ok();
}

struct handle {
  int fd;
  dev_t dev; /* the registered file, to tell a closed or reused descriptor at deregistration */
  ino_t ino;
};

EXPORT CUfileError_t cuFileHandleRegister(void** fh, CUfileDescr_t* d) {
  pthread_mutex_lock(&lock);
  ++register_calls;
  pthread_mutex_unlock(&lock);
  if (!driver_open()) return err(5001);
  pthread_mutex_lock(&lock);
  int e = register_err;
  pthread_mutex_unlock(&lock);
  if (e) return err(e);
  if (d == NULL || d->type != 1 || d->fs_ops != NULL) return err(5022);
  int fl = fcntl(d->handle.fd, F_GETFL);
  if (fl < 0) return err(5022);
  /* Host memory from malloc cannot take O_DIRECT; the fake serves the file buffered. */
  pthread_mutex_lock(&lock);
  int keep = keep_direct;
  pthread_mutex_unlock(&lock);
  if ((fl & O_DIRECT) && !keep) (void)fcntl(d->handle.fd, F_SETFL, fl & ~O_DIRECT);
  struct handle* h = malloc(sizeof *h);
  if (h == NULL) return err(5030);
  h->fd = d->handle.fd;
  struct stat sb;
  if (fstat(h->fd, &sb) == 0) {
    h->dev = sb.st_dev;
    h->ino = sb.st_ino;
  } else {
    h->dev = 0;
    h->ino = 0;
  }
  *fh = h;
  pthread_mutex_lock(&lock);
  ++handles;
  pthread_mutex_unlock(&lock);
  return ok();
}
EXPORT void cuFileHandleDeregister(void* fh) {
  if (fh == NULL) return;
  struct handle* h = fh;
  struct stat sb;
  const int still_open = fstat(h->fd, &sb) == 0 && sb.st_dev == h->dev && sb.st_ino == h->ino;
  free(fh);
  pthread_mutex_lock(&lock);
  --handles;
  ++deregister_calls;
  deregister_io_calls = io_calls;
  deregister_fd_open = still_open;
  pthread_mutex_unlock(&lock);
}
EXPORT long deepio_fake_cufile_handle_deregister_calls(void) {
  pthread_mutex_lock(&lock);
  long n = deregister_calls;
  pthread_mutex_unlock(&lock);
  return n;
}
EXPORT void deepio_fake_cufile_last_deregister(long* io, int* fd_open) {
  pthread_mutex_lock(&lock);
  *io = deregister_io_calls;
  *fd_open = deregister_fd_open;
  pthread_mutex_unlock(&lock);
}
EXPORT void deepio_fake_cufile_hold_io(int on) {
  pthread_mutex_lock(&lock);
  hold_io = on;
  pthread_cond_broadcast(&hold_cv);
  pthread_mutex_unlock(&lock);
}
EXPORT long deepio_fake_cufile_io_held(void) {
  pthread_mutex_lock(&lock);
  long n = io_held;
  pthread_mutex_unlock(&lock);
  return n;
}

/* Parameters are staged before the driver opens, as with the real library: once it is open
 * they are refused with CU_FILE_DRIVER_ALREADY_OPEN. Staging one has no other effect here: like
 * the real library on a machine without nvidia-fs, allowing compatibility mode does not stop
 * deepio_fake_cufile_fail_register(5027) from refusing files. */
EXPORT CUfileError_t cuFileSetParameterBool(int param, _Bool value) {
  if (param < 0 || param >= MAX_PARAMS) return err(5022);
  if (driver_open()) return err(5026);
  pthread_mutex_lock(&lock);
  if (!bool_params_init) {
    for (int i = 0; i < MAX_PARAMS; ++i) bool_params[i] = -1;
    bool_params_init = 1;
  }
  bool_params[param] = value ? 1 : 0;
  pthread_mutex_unlock(&lock);
  return ok();
}
EXPORT void deepio_fake_cufile_keep_direct(int on) {
  pthread_mutex_lock(&lock);
  keep_direct = on;
  pthread_mutex_unlock(&lock);
}
EXPORT long deepio_fake_cufile_handle_register_calls(void) {
  pthread_mutex_lock(&lock);
  long n = register_calls;
  pthread_mutex_unlock(&lock);
  return n;
}
/* String parameters (CUFileStringConfigParameter_t: 0 logging level, 1 log file path, 2 log
 * directory), staged before the driver opens like the bool ones. The returned text stays valid
 * until the next reset or set. */
EXPORT CUfileError_t cuFileSetParameterString(int param, const char* value) {
  if (param < 0 || param >= MAX_STRING_PARAMS || value == NULL || strlen(value) >= 512) return err(5022);
  if (driver_open()) return err(5026);
  pthread_mutex_lock(&lock);
  strcpy(string_params[param], value);
  string_params_set[param] = 1;
  pthread_mutex_unlock(&lock);
  return ok();
}
EXPORT const char* deepio_fake_cufile_param_string(int param) {
  pthread_mutex_lock(&lock);
  const char* v = param >= 0 && param < MAX_STRING_PARAMS && string_params_set[param] ? string_params[param] : NULL;
  pthread_mutex_unlock(&lock);
  return v;
}
EXPORT CUfileError_t cuFileGetParameterBool(int param, _Bool* value) {
  if (param < 0 || param >= MAX_PARAMS || value == NULL) return err(5022);
  pthread_mutex_lock(&lock);
  *value = bool_params_init && bool_params[param] == 1;
  pthread_mutex_unlock(&lock);
  return ok();
}

EXPORT CUfileError_t cuFileBufRegister(const void* p, size_t n, int flags) {
  (void)flags;
  if (!driver_open()) return err(5001);
  pthread_mutex_lock(&lock);
  int be = bufregister_err;
  pthread_mutex_unlock(&lock);
  if (be) return err(be);
  if (!deepio_fake_cuda_find((uintptr_t)p, n, NULL, NULL)) return err(5013);
  CUfileError_t r = err(5030);
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_BUFS; ++i) {
    if (bufs[i].base == (uintptr_t)p) {
      r = err(5023);
      goto out;
    }
  }
  for (int i = 0; i < MAX_BUFS; ++i) {
    if (bufs[i].base == 0) {
      bufs[i].base = (uintptr_t)p;
      bufs[i].n = n;
      r = ok();
      break;
    }
  }
out:
  pthread_mutex_unlock(&lock);
  return r;
}
EXPORT CUfileError_t cuFileBufDeregister(const void* p) {
  CUfileError_t r = err(5024);
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_BUFS; ++i) {
    if (bufs[i].base == (uintptr_t)p) {
      bufs[i].base = 0;
      r = ok();
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return r;
}

static ssize_t io(int write, void* fh, uintptr_t base, size_t n, off_t file_off, off_t buf_off) {
  if (!driver_open()) return -5001;
  if (fh == NULL) return -5027;
  if (!deepio_fake_cuda_find(base + (uintptr_t)buf_off, n, NULL, NULL)) return -5014;
  pthread_mutex_lock(&lock);
  /* A registered base must cover the whole range, as with the real library. */
  for (int i = 0; i < MAX_BUFS; ++i) {
    if (bufs[i].base == base && (size_t)buf_off + n > bufs[i].n) {
      pthread_mutex_unlock(&lock);
      return -5014;
    }
  }
  ++io_calls;
  last_base = base;
  last_offset = (long)buf_off;
  long inject = 0;
  int inject_errno = 0;
  if (io_fail_write == write) {
    if (io_fail_after == 0) {
      inject = io_fail_result;
      inject_errno = io_fail_errno;
      io_fail_write = -1;
    } else {
      --io_fail_after;
    }
  }
  if (max_io != 0 && n > max_io) n = max_io;
  if ((long)n > max_io_seen) max_io_seen = (long)n;
  if (++concurrency > max_concurrency) max_concurrency = concurrency;
  ++io_held;
  while (hold_io) pthread_cond_wait(&hold_cv, &lock);
  --io_held;
  unsigned d = delay_us;
  pthread_mutex_unlock(&lock);
  if (d) usleep(d);
  ssize_t r;
  if (inject != 0) {
    r = inject;
  } else {
    int fd = ((struct handle*)fh)->fd;
    void* p = (void*)(base + (uintptr_t)buf_off);
    r = write ? pwrite(fd, p, n, file_off) : pread(fd, p, n, file_off);
  }
  pthread_mutex_lock(&lock);
  --concurrency;
  pthread_mutex_unlock(&lock);
  if (inject == -1) errno = inject_errno;
  return r;
}

EXPORT ssize_t cuFileRead(void* fh, void* base, size_t n, off_t file_off, off_t buf_off) {
  return io(0, fh, (uintptr_t)base, n, file_off, buf_off);
}
EXPORT ssize_t cuFileWrite(void* fh, const void* base, size_t n, off_t file_off, off_t buf_off) {
  return io(1, fh, (uintptr_t)base, n, file_off, buf_off);
}
