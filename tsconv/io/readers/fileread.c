/* Read many whole files into one buffer, in parallel, without the Python interpreter.
 *
 * tsconv.io.readers.fileread compiles this with the system C compiler and calls it through ctypes, which releases
 * the GIL for the whole call: the GPU reader's batches of chunk files (and the writer's time chunks) are
 * read without the per-file Python that, in reading threads, kept taking the GIL from the engine thread
 * (benchmarks/NOTES.md, "Native file reads").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_THREADS 64

/* Work is cut into parts of at most `part` bytes, so that a batch of a few large files keeps every thread
 * busy to the end (12 files of 10 MB on 8 threads: whole files left 4 threads idle for the second round). */
typedef struct {
    int n_items;
    const char *const *paths;
    uint8_t *base;
    const int64_t *offsets;
    const int64_t *sizes;
    const int *item_file;
    const int64_t *item_pos;
    int64_t part;
    _Atomic int64_t *got;
    _Atomic int *err;
    atomic_int next;
} job_t;

static void read_part(job_t *j, int k) {
    int i = j->item_file[k];
    int64_t pos = j->item_pos[k], end = pos + j->part;
    if (end > j->sizes[i]) end = j->sizes[i];
    int fd = open(j->paths[i], O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int expected = 0;
        atomic_compare_exchange_strong(&j->err[i], &expected, errno ? errno : EIO);
        return;
    }
    uint8_t *dst = j->base + j->offsets[i];
    int64_t at = pos;
    while (at < end) {
        ssize_t r = pread(fd, dst + at, (size_t)(end - at), (off_t)at);
        if (r < 0) {
            if (errno == EINTR) continue;
            int expected = 0;
            atomic_compare_exchange_strong(&j->err[i], &expected, errno ? errno : EIO);
            break;
        }
        if (r == 0) break; /* the file is shorter than its size: the caller sees fewer bytes */
        at += r;
    }
    close(fd);
    atomic_fetch_add(&j->got[i], at - pos);
}

static void *worker(void *arg) {
    job_t *j = (job_t *)arg;
    for (;;) {
        int k = atomic_fetch_add(&j->next, 1);
        if (k >= j->n_items) break;
        read_part(j, k);
    }
    return NULL;
}

/* Read file i (paths[i], sizes[i] bytes) to base + offsets[i], for i < n, on up to `threads` threads (the
 * caller's among them), in parts of at most `part` bytes. status[i]: the bytes read (fewer than sizes[i]
 * when the file is shorter) or -errno. Returns the threads used, or -ENOMEM. */
int tsconv_read_files(int n, const char *const *paths, uint8_t *base, const int64_t *offsets,
                      const int64_t *sizes, int64_t *status, int threads, int64_t part) {
    if (part < 1) part = INT64_MAX;
    int n_items = 0;
    for (int i = 0; i < n; i++) n_items += sizes[i] > 0 ? (int)((sizes[i] + part - 1) / part) : 1;
    int *item_file = malloc(sizeof(int) * (size_t)(n_items ? n_items : 1));
    int64_t *item_pos = malloc(sizeof(int64_t) * (size_t)(n_items ? n_items : 1));
    _Atomic int64_t *got = calloc((size_t)(n ? n : 1), sizeof(*got));
    _Atomic int *err = calloc((size_t)(n ? n : 1), sizeof(*err));
    if (!item_file || !item_pos || !got || !err) {
        free(item_file); free(item_pos); free((void *)got); free((void *)err);
        return -ENOMEM;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        int64_t pos = 0;
        do { /* a file of size 0 still gets one item: it is opened, so a missing file is reported */
            item_file[k] = i;
            item_pos[k++] = pos;
            pos += part;
        } while (pos < sizes[i]);
    }
    job_t j;
    j.n_items = n_items;
    j.paths = paths;
    j.base = base;
    j.offsets = offsets;
    j.sizes = sizes;
    j.item_file = item_file;
    j.item_pos = item_pos;
    j.part = part;
    j.got = got;
    j.err = err;
    atomic_init(&j.next, 0);
    if (threads > n_items) threads = n_items;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads < 1) threads = 1;
    pthread_t tid[MAX_THREADS];
    int started = 0;
    for (int t = 1; t < threads; t++)
        if (pthread_create(&tid[started], NULL, worker, &j) == 0) started++;
    worker(&j);
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    for (int i = 0; i < n; i++) status[i] = err[i] ? -(int64_t)err[i] : got[i];
    free(item_file); free(item_pos); free((void *)got); free((void *)err);
    return started + 1;
}
