/* Loaded with LD_PRELOAD by `AB_COPIES=1 bench/ab-node`: counts the bytes and calls of every
 * memcpy and memmove by the address it returns to, and writes the counts to
 * $COPIES_DIR/copies.<pid> on SIGUSR2 ("address bytes calls" a line, for bench/copies-report.py).
 * Large futures moved by value show up here as copies of a few hundred bytes to a few KB. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define SLOTS 65536 /* a power of two, far more than the call sites a run meets */

static uintptr_t sites[SLOTS];
static uint64_t bytes[SLOTS], calls[SLOTS];
static void *(*real_memcpy)(void *, const void *, size_t);
static void *(*real_memmove)(void *, const void *, size_t);

static void count(uintptr_t site, size_t n) {
  size_t slot = (site * 0x9E3779B97F4A7C15ull) >> 48;
  for (;; slot = (slot + 1) & (SLOTS - 1)) {
    uintptr_t seen = __atomic_load_n(&sites[slot], __ATOMIC_ACQUIRE);
    if (seen == 0) {
      uintptr_t empty = 0;
      if (!__atomic_compare_exchange_n(&sites[slot], &empty, site, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
          empty != site)
        continue;
    } else if (seen != site) {
      continue;
    }
    __atomic_fetch_add(&bytes[slot], n, __ATOMIC_RELAXED);
    __atomic_fetch_add(&calls[slot], 1, __ATOMIC_RELAXED);
    return;
  }
}

static void dump(int signal) {
  (void)signal;
  char path[4096];
  const char *dir = getenv("COPIES_DIR");
  snprintf(path, sizeof path, "%s/copies.%d", dir ? dir : "/tmp", getpid());
  FILE *out = fopen(path, "w");
  if (!out) return;
  for (size_t slot = 0; slot < SLOTS; slot++)
    if (sites[slot]) fprintf(out, "%lx %lu %lu\n", (unsigned long)sites[slot], bytes[slot], calls[slot]);
  fclose(out);
}

__attribute__((constructor)) static void start(void) {
  real_memcpy = (void *(*)(void *, const void *, size_t))dlsym(RTLD_NEXT, "memcpy");
  real_memmove = (void *(*)(void *, const void *, size_t))dlsym(RTLD_NEXT, "memmove");
  signal(SIGUSR2, dump);
}

void *memcpy(void *to, const void *from, size_t n) {
  count((uintptr_t)__builtin_return_address(0), n);
  if (!real_memcpy) { /* a copy before the constructor ran (the loader's own) */
    char *t = to;
    const char *f = from;
    while (n--) *t++ = *f++;
    return to;
  }
  return real_memcpy(to, from, n);
}

void *memmove(void *to, const void *from, size_t n) {
  count((uintptr_t)__builtin_return_address(0), n);
  if (!real_memmove) { /* as above; the ranges may overlap */
    char *t = to;
    const char *f = from;
    if (t < f)
      while (n--) *t++ = *f++;
    else
      while (n--) t[n] = f[n];
    return to;
  }
  return real_memmove(to, from, n);
}
