/*
 * A companion to libfaketime for scripts/test's POSBRIDGE_TEST_CLOCK, which
 * moves both clocks, the realtime one and the monotonic one, by the same
 * shift. A program that computes a deadline from a moved clock and hands it
 * to the kernel (which keeps the real ones) would wait for the whole shift,
 * a month; libfaketime moves such deadlines back for the calls it wraps
 * (pthread_cond_timedwait, sem_timedwait, clock_nanosleep), not for two
 * more this project's programs use:
 * - C11's cnd_timedwait (librdkafka's timed waits, a realtime deadline):
 *   glibc's calls its condition wait internally, out of libfaketime's sight;
 * - futex waits with an absolute deadline (FUTEX_WAIT_BITSET), which Rust's
 *   std makes through syscall(2) for every timed wait (a Condvar's, a
 *   channel's recv_timeout, park_timeout) on the monotonic clock.
 * Each moves the deadline back to the real clock and waits with the
 * system's own.
 * Built by scripts/test: gcc -shared -fPIC -o cnd_timedwait.so cnd_timedwait.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <sys/syscall.h>
#include <threads.h>
#include <time.h>

typedef long (*syscall_fn)(long, ...);

static syscall_fn system_syscall(void) {
    static syscall_fn found;
    if (!found) {
        found = (syscall_fn)dlsym(RTLD_NEXT, "syscall");
    }
    return found;
}

/* A deadline on `clock` read moved, on the real clock. */
static struct timespec real_deadline(clockid_t clock, const struct timespec *moved) {
    struct timespec now_moved, now_real, real;
    clock_gettime(clock, &now_moved);                            /* libfaketime's */
    system_syscall()(SYS_clock_gettime, (long)clock, (long)&now_real); /* the kernel's */
    long long shift = (long long)(now_moved.tv_sec - now_real.tv_sec) * 1000000000LL
                      + (now_moved.tv_nsec - now_real.tv_nsec);
    long long at = (long long)moved->tv_sec * 1000000000LL + moved->tv_nsec - shift;
    real.tv_sec = at / 1000000000LL;
    real.tv_nsec = at % 1000000000LL;
    return real;
}

int cnd_timedwait(cnd_t *restrict cond, mtx_t *restrict mutex,
                  const struct timespec *restrict moved) {
    static int (*glibc)(cnd_t *restrict, mtx_t *restrict, const struct timespec *restrict);
    if (!glibc) {
        glibc = dlsym(RTLD_NEXT, "cnd_timedwait");
    }
    struct timespec real = real_deadline(CLOCK_REALTIME, moved);
    return glibc(cond, mutex, &real);
}

long syscall(long number, ...) {
    va_list args;
    va_start(args, number);
    long a = va_arg(args, long), b = va_arg(args, long), c = va_arg(args, long);
    long d = va_arg(args, long), e = va_arg(args, long), f = va_arg(args, long);
    va_end(args);
    struct timespec real;
    int op = (int)b & FUTEX_CMD_MASK;
    if (number == SYS_futex && d != 0
        && op == FUTEX_WAIT_BITSET) {
        clockid_t clock = ((int)b & FUTEX_CLOCK_REALTIME) ? CLOCK_REALTIME : CLOCK_MONOTONIC;
        real = real_deadline(clock, (const struct timespec *)d);
        d = (long)&real;
    }
    return system_syscall()(number, a, b, c, d, e, f);
}
