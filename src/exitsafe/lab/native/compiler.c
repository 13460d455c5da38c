/*
 * exitsafe lab compiler: the dependency library of the lab runtime.
 *
 * It stands for a shader compiler (dxcompiler) or any plugin whose code a
 * runtime runs while releasing its objects: the runtime creates a "program"
 * here for every device and releases it when the device is released.  The
 * runtime only borrows this library (see rt_init in README.md), so once the
 * host has dlclose()d its last reference the code below is unmapped and the
 * next device release jumps into nothing: SIGSEGV.
 *
 * C99 + POSIX.  No constructor, no destructor, no thread-local storage and no
 * dependency on the runtime, so dlclose() really unmaps it.
 */
#define _GNU_SOURCE 1

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exitsafe_lab.h"

#define CC_MAX_PROGRAMS 65536

static pthread_mutex_t cc_lock = PTHREAD_MUTEX_INITIALIZER;
/* 0 = never created, 1 = alive, 2 = released */
static unsigned char cc_state[CC_MAX_PROGRAMS];
static int cc_next;
static int cc_live;

static void cc_fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void cc_fatal(const char *fmt, ...) {
    char line[512];
    int n = snprintf(line, sizeof line, "FATAL: compiler: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 2, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    const char *p = line;
    while (len > 0) {
        ssize_t w = write(2, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            break;
        }
        p += w;
        len -= (size_t)w;
    }
    abort();
}

const char *cc_version(void) { return "exitsafe-lab-compiler 1"; }

int cc_program_create(unsigned long long device_id) {
    (void)device_id;
    pthread_mutex_lock(&cc_lock);
    if (cc_next >= CC_MAX_PROGRAMS) cc_fatal("too many programs (%d)", CC_MAX_PROGRAMS);
    int program = cc_next++;
    cc_state[program] = 1;
    cc_live++;
    pthread_mutex_unlock(&cc_lock);
    return program;
}

int cc_program_release(int program) {
    pthread_mutex_lock(&cc_lock);
    if (program < 0 || program >= cc_next) cc_fatal("program %d was never created", program);
    if (cc_state[program] != 1) cc_fatal("program %d released twice", program);
    cc_state[program] = 2;
    cc_live--;
    pthread_mutex_unlock(&cc_lock);
    return 0;
}

int cc_live_programs(void) {
    pthread_mutex_lock(&cc_lock);
    int n = cc_live;
    pthread_mutex_unlock(&cc_lock);
    return n;
}
