/* Counts malloc calls in a process (LD_PRELOAD) and writes the total to
 * $MALLOC_COUNT_OUT when it exits: bench/router_allocs.sh reads it. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
static atomic_ulong count;

void *malloc(size_t n) {
  atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
  return __libc_malloc(n);
}

__attribute__((destructor)) static void report(void) {
  const char *path = getenv("MALLOC_COUNT_OUT");
  if (path == NULL) return;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  char buf[32];
  int k = snprintf(buf, sizeof buf, "%lu\n", (unsigned long)atomic_load(&count));
  if (k > 0 && write(fd, buf, (size_t)k) < 0) { /* nothing to do */ }
  close(fd);
}
