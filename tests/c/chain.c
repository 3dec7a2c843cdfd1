/* A known call chain for the unwinder's test: main → chain_a → chain_b → chain_c.
 * chain_c spins; chain_b first blocks in read() on a timerfd (off-CPU). Built
 * -O2 -fomit-frame-pointer, as Debian builds its programs: rbp holds data, not frames.
 * Each call's result is used after it returns, so none is a tail call. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))

static volatile uint64_t sink;

NOINLINE uint64_t chain_c(uint64_t n) {
    uint64_t x = n;
    for (uint64_t i = 0; i < n; i++)
        x = x * 6364136223846793005ULL + (x >> 29) + i;
    sink = x;
    return x | 1;
}

NOINLINE uint64_t chain_b(int fd, uint64_t n) {
    uint64_t ticks = 0;
    if (read(fd, &ticks, sizeof ticks) != sizeof ticks)
        exit(2);
    return chain_c(n) * 3 + ticks;
}

NOINLINE uint64_t chain_a(int fd, uint64_t n) {
    return chain_b(fd, n) ^ (uint64_t)fd;
}

/* chain MS ROUNDS: ROUNDS times, wait MS on the timer and then spin ~MS. */
int main(int argc, char **argv) {
    long ms = argc > 1 ? atol(argv[1]) : 10;
    long rounds = argc > 2 ? atol(argv[2]) : 50;
    int fd = timerfd_create(CLOCK_MONOTONIC, 0);
    struct itimerspec t = {{0, ms * 1000000}, {0, ms * 1000000}};
    if (fd < 0 || timerfd_settime(fd, 0, &t, NULL) < 0)
        return 1;
    uint64_t acc = 0;
    for (long r = 0; r < rounds; r++)
        acc += chain_a(fd, (uint64_t)ms * 400000);
    sink = acc;
    return 0;
}
