#!/usr/bin/env bash
# Read bandwidth of this machine over a buffer the size of a model's weights, by how its pages
# are held: anonymous memory in 4 KiB pages and in transparent huge pages (2 MiB,
# `madvise(MADV_HUGEPAGE)`); a file's page cache mapped read-only, read from disk into a map
# advised MADV_HUGEPAGE ("file, huge": how the executor maps weight files on Linux,
# crates/anemone-mil/src/huge_pages.rs), advised MADV_NOHUGEPAGE ("file, 4 KiB"), and as left
# by writing it ("file as written": a freshly converted bundle). What a single-token matvec,
# which streams every weight once per token, can reach either way.
#
#   benches/read_bandwidth.sh [MiB (default 540)] [threads (default 2)]
#
# Needs a C compiler (cc) with AVX-512 on x86-64, and MiB + 2 of free disk in TMPDIR. Prints
# best and mean of 30 passes (after 10 untimed ones) for each way, twice, each pass summing the
# whole buffer in 4 MiB pieces split between the threads (as a matvec splits its rows), with
# software prefetch 2 KiB ahead as the executor's kernels do.
set -euo pipefail
mib=${1:-540}
threads=${2:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/bw.c" <<'C'
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#define HUGE (2UL << 20)
#define PIECE (4UL << 20)
static char *buf; static size_t total; static int threads;
static pthread_barrier_t bar; static double times[40]; static volatile float sink;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void *work(void *arg) {
  long t = (long)arg; __m512 s = _mm512_setzero_ps();
  for (int pass = 0; pass < 40; pass++) {
    pthread_barrier_wait(&bar); double t0 = now();
    for (size_t m = 0; m < total; m += PIECE) {
      size_t part = PIECE / threads; const char *b = buf + m + t * part;
      for (size_t i = 0; i < part; i += 256) {
        for (int l = 0; l < 4; l++) _mm_prefetch(b + i + 2048 + 64 * l, _MM_HINT_T0);
        s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(b + i), _mm512_load_ps(b + i + 64)),
                                           _mm512_add_ps(_mm512_load_ps(b + i + 128), _mm512_load_ps(b + i + 192))));
      }
    }
    pthread_barrier_wait(&bar); if (t == 0) times[pass] = now() - t0;
  }
  sink = _mm512_reduce_add_ps(s); return 0;
}
int main(int argc, char **argv) {
  total = (size_t)atol(argv[1]) << 20; threads = atoi(argv[2]); int huge = atoi(argv[3]);
  size_t span = total + 2 * HUGE;
  char *map = mmap(0, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) { perror("mmap"); return 1; }
  buf = (char *)(((size_t)map + HUGE - 1) & ~(HUGE - 1));
  if (huge < 2) {
    madvise(map, span, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE); memset(buf, 1, total + 4096);
  } else {
    /* a file's page cache, mapped read-only at a huge-page boundary (as the executor maps
       weight files); mode 2 advised MADV_HUGEPAGE before its pages are read from disk */
    FILE *f = fopen(argv[4], "w+"); char *row = calloc(1, 1 << 20); memset(row, 1, 1 << 20);
    for (size_t m = 0; m < total + HUGE; m += 1 << 20) fwrite(row, 1, 1 << 20, f);
    fflush(f); fsync(fileno(f)); if (huge < 4) posix_fadvise(fileno(f), 0, 0, POSIX_FADV_DONTNEED);
    buf = mmap(buf, total + 4096, PROT_READ, MAP_SHARED | MAP_FIXED, fileno(f), 0);
    if (buf == MAP_FAILED) { perror("mmap file"); return 1; }
    if (huge < 4) madvise(buf, total + 4096, huge == 2 ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    madvise(buf, total + 4096, 22 /* MADV_POPULATE_READ */);
  }
  pthread_barrier_init(&bar, 0, threads); pthread_t th[16];
  for (long t = 0; t < threads; t++) pthread_create(&th[t], 0, work, (void *)t);
  for (int t = 0; t < threads; t++) pthread_join(th[t], 0);
  double best = 1e9, sum = 0; for (int p = 10; p < 40; p++) { if (times[p] < best) best = times[p]; sum += times[p]; }
  const char *kind[] = {"4 KiB pages", "huge pages", "file, huge", "file, 4 KiB", "file as written"};
  printf("%-16s %zu MiB, %d threads: best %5.1f GB/s, mean %5.1f GB/s\n", kind[huge],
         total >> 20, threads, total / best / 1e9, total / (sum / 30) / 1e9);
  return 0;
}
C
cc -O2 -mavx512f -pthread "$work/bw.c" -o "$work/bw"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
for mode in 0 1 2 3 4 0 1 2 3 4; do "$work/bw" "$mib" "$threads" "$mode" "$work/weights.bin"; done
