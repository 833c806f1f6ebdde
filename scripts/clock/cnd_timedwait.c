/*
 * A companion to libfaketime for scripts/test's POSBRIDGE_TEST_CLOCK: C11's
 * cnd_timedwait takes a deadline on the realtime clock, which a program
 * under libfaketime reads moved; glibc's cnd_timedwait calls its condition
 * wait internally, where libfaketime (which moves the deadlines of
 * pthread_cond_timedwait) cannot see it, so every timed wait of librdkafka
 * (which uses C11 threads) would last the clock's shift. This one moves the
 * deadline back to the real clock and waits with glibc's own.
 * Built by scripts/test: gcc -shared -fPIC -o cnd_timedwait.so cnd_timedwait.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/syscall.h>
#include <threads.h>
#include <time.h>
#include <unistd.h>

int cnd_timedwait(cnd_t *restrict cond, mtx_t *restrict mutex,
                  const struct timespec *restrict moved) {
    static int (*glibc)(cnd_t *restrict, mtx_t *restrict, const struct timespec *restrict);
    if (!glibc) {
        glibc = dlsym(RTLD_NEXT, "cnd_timedwait");
    }
    struct timespec now_moved, now_real, real;
    clock_gettime(CLOCK_REALTIME, &now_moved);          /* libfaketime's */
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &now_real); /* the kernel's */
    long long shift = (long long)(now_moved.tv_sec - now_real.tv_sec) * 1000000000LL
                      + (now_moved.tv_nsec - now_real.tv_nsec);
    long long at = (long long)moved->tv_sec * 1000000000LL + moved->tv_nsec - shift;
    real.tv_sec = at / 1000000000LL;
    real.tv_nsec = at % 1000000000LL;
    return glibc(cond, mutex, &real);
}
