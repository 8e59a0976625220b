/* Read many whole files into one buffer, in parallel, without the Python interpreter.
 *
 * tsconv.io.fileread compiles this with the system C compiler and calls it through ctypes, which releases
 * the GIL for the whole call: the GPU reader's batches of chunk files (and the writer's time chunks) are
 * read without the per-file Python that, in reading threads, kept taking the GIL from the engine thread
 * (benchmarks/NOTES.md, fourteenth session).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#define MAX_THREADS 64

typedef struct {
    int n;
    const char *const *paths;
    uint8_t *base;
    const int64_t *offsets;
    const int64_t *sizes;
    int64_t *status;
    atomic_int next;
} job_t;

/* status[i]: bytes read (at most sizes[i]; fewer when the file is shorter), or -errno. */
static void read_one(job_t *j, int i) {
    int64_t size = j->sizes[i], got = 0;
    int fd = open(j->paths[i], O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        j->status[i] = -(int64_t)errno;
        return;
    }
    uint8_t *dst = j->base + j->offsets[i];
    while (got < size) {
        ssize_t r = pread(fd, dst + got, (size_t)(size - got), (off_t)got);
        if (r < 0) {
            if (errno == EINTR) continue;
            j->status[i] = -(int64_t)errno;
            close(fd);
            return;
        }
        if (r == 0) break;
        got += r;
    }
    close(fd);
    j->status[i] = got;
}

static void *worker(void *arg) {
    job_t *j = (job_t *)arg;
    for (;;) {
        int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n) break;
        read_one(j, i);
    }
    return NULL;
}

/* Read file i (paths[i], sizes[i] bytes) to base + offsets[i], for i < n, on up to `threads` threads
 * (the caller's among them). Returns the number of threads used. */
int tsconv_read_files(int n, const char *const *paths, uint8_t *base, const int64_t *offsets,
                      const int64_t *sizes, int64_t *status, int threads) {
    job_t j;
    j.n = n;
    j.paths = paths;
    j.base = base;
    j.offsets = offsets;
    j.sizes = sizes;
    j.status = status;
    atomic_init(&j.next, 0);
    if (threads > n) threads = n;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads < 1) threads = 1;
    pthread_t tid[MAX_THREADS];
    int started = 0;
    for (int t = 1; t < threads; t++)
        if (pthread_create(&tid[started], NULL, worker, &j) == 0) started++;
    worker(&j);
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    return started + 1;
}
