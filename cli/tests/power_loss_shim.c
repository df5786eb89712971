/* The power-loss layer of cli/tests/power_loss.rs, preloaded (LD_PRELOAD) into a child
 * process that writes Halyard's stores. After every fsync or fdatasync that succeeds on a
 * regular file under $HALYARD_POWER_ROOT, it copies the file as it is then (holes kept)
 * to $HALYARD_POWER_SHADOW/<inode>: what that sync made durable. After the child is
 * killed, the test gives every file its last synced copy, and a file never synced no
 * bytes at all: every write after the last completed sync of its file is discarded (the
 * names of files, created, renamed or removed, are kept as the child left them).
 * Rust's File::sync_all and sync_data call these two glibc functions. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One copy at a time: two syncs of one file on two threads must not write one copy
 * together, nor an older copy land after a newer one. */
static pthread_mutex_t copying = PTHREAD_MUTEX_INITIALIZER;

static void snapshot_locked(int fd);

static void snapshot(int fd) {
    pthread_mutex_lock(&copying);
    snapshot_locked(fd);
    pthread_mutex_unlock(&copying);
}

static void snapshot_locked(int fd) {
    const char *root = getenv("HALYARD_POWER_ROOT");
    const char *shadow = getenv("HALYARD_POWER_SHADOW");
    if (!root || !shadow) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = 0;
    if (strncmp(path, root, strlen(root)) != 0) return;
    char tmp[4096], dst[4096];
    snprintf(dst, sizeof dst, "%s/%lu", shadow, (unsigned long)st.st_ino);
    snprintf(tmp, sizeof tmp, "%s/%lu.%d.tmp", shadow, (unsigned long)st.st_ino, fd);
    int in = open(link, O_RDONLY | O_CLOEXEC);
    if (in < 0) abort();
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0) abort();
    static char buf[1 << 16];
    off_t off = 0;
    for (;;) {
        off_t data = lseek(in, off, SEEK_DATA);
        if (data < 0) break;
        off_t hole = lseek(in, data, SEEK_HOLE);
        if (hole < 0) abort();
        for (off_t at = data; at < hole;) {
            size_t want = (size_t)(hole - at) < sizeof buf ? (size_t)(hole - at) : sizeof buf;
            ssize_t got = pread(in, buf, want, at);
            if (got <= 0) break;
            if (pwrite(out, buf, (size_t)got, at) != got) abort();
            at += got;
        }
        off = hole;
    }
    if (ftruncate(out, st.st_size) != 0) abort();
    close(in);
    close(out);
    /* Whole or not at all: a kill in the middle leaves the sync before. */
    if (rename(tmp, dst) != 0) abort();
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int r = real(fd);
    if (r == 0) snapshot(fd);
    return r;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int r = real(fd);
    if (r == 0) snapshot(fd);
    return r;
}
