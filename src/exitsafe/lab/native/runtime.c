/*
 * exitsafe lab runtime: a small native runtime that fails loudly and
 * deterministically when its objects are released in the wrong order, used
 * twice, used after teardown, or when its dependency library is gone.
 *
 * Objects: instance -> device -> buffer, and a standalone catalog.  Every
 * object carries a magic number and a parent pointer; every call checks the
 * runtime state, the pointer (it must be an object this runtime created, of
 * the right kind), the object (not released) and its ancestors (not
 * released).  Released objects are never freed: their magic becomes DEAD, so
 * a second release or a late use is detected, never undefined behaviour.
 *
 * A broken rule prints "FATAL: <rule broken> ..." on stderr and aborts.
 * README.md documents the API, the rules and the leak report.
 *
 * C99 + POSIX (libc, libdl, pthreads).  Built by exitsafe/lab/build.py.
 */
#define _GNU_SOURCE 1

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "exitsafe_lab.h"

#define RT_VERSION "exitsafe-lab-runtime 1"

#define MAGIC_INSTANCE 0x494e5354u /* "INST" */
#define MAGIC_DEVICE 0x44455643u   /* "DEVC" */
#define MAGIC_BUFFER 0x42554646u   /* "BUFF" */
#define MAGIC_CATALOG 0x4341544cu  /* "CATL" */
#define MAGIC_DEAD 0xdeaddeadu     /* released: kept in the graveyard */

#define KIND_COUNT 4

/* Slots of the table shared with forked children (MAP_SHARED): one int per
 * object: 0 = unused, > 0 = alive (creator pid), < 0 = destroyed (-pid of
 * the process that released it).  It models driver-side state that a forked
 * child shares with its parent through an inherited file descriptor. */
#define SHARED_SLOTS (1 << 18)

struct rt_object {
    uint32_t magic;      /* kind magic while alive, MAGIC_DEAD once released */
    int kind;            /* RT_KIND_* (kept after release) */
    struct rt_object *parent;
    unsigned long long id; /* per-process creation number, for messages */
    pid_t owner;         /* process that created it */
    long slot;           /* index in the shared table, -1 when full */
    int children;        /* live children */
    /* device */
    int lost;
    int program;
    int submits;
    int running;         /* rt_device_run calls in progress */
    int waiters;         /* threads blocked in rt_device_wait */
    int woken;           /* rt_device_wake was called: every wait returns at once */
    /* buffer */
    size_t size;
    unsigned char *data;
};

/* The public types are the same object; the distinct names keep the API typed. */
struct rt_instance { struct rt_object o; };
struct rt_device { struct rt_object o; };
struct rt_buffer { struct rt_object o; };
struct rt_catalog { struct rt_object o; };

struct shared_table {
    long next_slot;
    int slots[SHARED_SLOTS];
};

static const char *const KIND_NAMES[KIND_COUNT] = {"instance", "device", "buffer", "catalog"};
static const uint32_t KIND_MAGIC[KIND_COUNT] = {MAGIC_INSTANCE, MAGIC_DEVICE, MAGIC_BUFFER,
                                                 MAGIC_CATALOG};
static const char *const CATALOG_ENTRIES[] = {"lab-cpu", "lab-gpu", "lab-npu"};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* Signalled (with g_lock) when a device is woken: rt_device_wait waits on it. */
static pthread_cond_t g_wake = PTHREAD_COND_INITIALIZER;
static int g_torn_down = RT_LIVE;
static const char *g_teardown_what = "";
static pid_t g_load_pid;
static unsigned long long g_next_id = 1;
static int g_live[KIND_COUNT];
static int g_inherited;
static struct shared_table *g_shared;
static int g_initialized;
static int g_filters; /* rt_filter calls in progress */

/* Every object ever created (the graveyard included): an open-addressing set
 * of addresses, so a pointer that is not ours is reported, not dereferenced. */
static uintptr_t *g_set;
static size_t g_set_cap;
static size_t g_set_len;

/* Borrowed compiler entry points (see rt_init). */
static int (*g_cc_create)(unsigned long long);
static int (*g_cc_release)(int);

/* Logger. */
static rt_log_fn g_log_fn;
static int g_log_registered;
static int g_log_stop;
static unsigned int g_log_interval_us;
static pthread_t g_log_thread;
static unsigned long long g_log_calls;

/* ---- failure ------------------------------------------------------------ */

static void write_all(int fd, const char *text, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, text, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return;
        }
        text += n;
        len -= (size_t)n;
    }
}

/* Print "FATAL: <message>" on stderr in one write and abort(). */
static void fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fatal(const char *fmt, ...) {
    char line[1024];
    int n = snprintf(line, sizeof line, "FATAL: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 2, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    write_all(2, line, len);
    abort();
}

static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...) {
    char line[1024];
    int n = snprintf(line, sizeof line, "exitsafe-lab: warning: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 2, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    write_all(2, line, len);
}

/* ---- object set --------------------------------------------------------- */

static size_t set_index(uintptr_t p, size_t cap) {
    uint64_t h = (uint64_t)p * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static void set_insert_raw(uintptr_t *set, size_t cap, uintptr_t p) {
    size_t i = set_index(p, cap);
    while (set[i] != 0) i = (i + 1) & (cap - 1);
    set[i] = p;
}

static void set_add(const void *obj) {
    if ((g_set_len + 1) * 2 > g_set_cap) {
        size_t cap = g_set_cap ? g_set_cap * 2 : 1024;
        uintptr_t *set = calloc(cap, sizeof *set);
        if (!set) fatal("out of memory growing the object set");
        for (size_t i = 0; i < g_set_cap; i++)
            if (g_set[i]) set_insert_raw(set, cap, g_set[i]);
        free(g_set);
        g_set = set;
        g_set_cap = cap;
    }
    set_insert_raw(g_set, g_set_cap, (uintptr_t)obj);
    g_set_len++;
}

static int set_has(const void *obj) {
    if (!g_set_cap) return 0;
    size_t i = set_index((uintptr_t)obj, g_set_cap);
    while (g_set[i] != 0) {
        if (g_set[i] == (uintptr_t)obj) return 1;
        i = (i + 1) & (g_set_cap - 1);
    }
    return 0;
}

/* ---- checks --------------------------------------------------------------- */

static void check_runtime(const char *fn) {
    if (g_torn_down)
        fatal("runtime used after it was torn down (%s called after %s)", fn, g_teardown_what);
}

static int shared_get(long slot) {
    if (!g_shared || slot < 0) return 1;
    return __atomic_load_n(&g_shared->slots[slot], __ATOMIC_SEQ_CST);
}

static void shared_set(long slot, int value) {
    if (g_shared && slot >= 0) __atomic_store_n(&g_shared->slots[slot], value, __ATOMIC_SEQ_CST);
}

/*
 * Validate `ptr` as a live object of `kind` whose ancestors are all alive;
 * `releasing` selects the wording ("released twice" vs "used after release").
 * Called with g_lock held.
 */
static struct rt_object *check_object(const void *ptr, int kind, const char *fn, int releasing) {
    check_runtime(fn);
    const char *name = KIND_NAMES[kind];
    if (ptr == NULL) fatal("%s: NULL %s", fn, name);
    if (!set_has(ptr)) fatal("%s: %p is not a %s created by this runtime", fn, ptr, name);
    struct rt_object *o = (struct rt_object *)ptr;
    if (o->kind != kind)
        fatal("%s: %p is the wrong kind of object (kind %s, expected %s)", fn, ptr,
              KIND_NAMES[o->kind], name);
    if (o->magic == MAGIC_DEAD) {
        if (releasing) fatal("%s released twice (%s on %s #%llu)", name, fn, name, o->id);
        fatal("%s used after release (%s on %s #%llu)", name, fn, name, o->id);
    }
    if (o->magic != KIND_MAGIC[kind])
        fatal("%s: %s #%llu has a corrupted magic number 0x%08x", fn, name, o->id,
              (unsigned)o->magic);
    int shared = shared_get(o->slot);
    if (shared < 0)
        fatal("%s #%llu was destroyed by another process (pid %d, a forked child?) (%s in "
              "process %d)",
              name, o->id, -shared, fn, (int)getpid());
    for (struct rt_object *a = o->parent; a != NULL; a = a->parent) {
        int ashared = shared_get(a->slot);
        if (ashared < 0 && a->magic != MAGIC_DEAD)
            fatal("%s #%llu %s after its %s %s #%llu was destroyed by another process (pid %d, "
                  "a forked child?) (%s)",
                  name, o->id, releasing ? "released" : "used",
                  a == o->parent ? "parent" : "ancestor", KIND_NAMES[a->kind], a->id, -ashared,
                  fn);
        if (a->magic == MAGIC_DEAD) {
            const char *what = a == o->parent ? "parent" : "ancestor";
            if (releasing)
                fatal("%s released after its %s %s was released (%s on %s #%llu, %s #%llu)", name,
                      what, KIND_NAMES[a->kind], fn, name, o->id, KIND_NAMES[a->kind], a->id);
            fatal("%s used after its %s %s was released (%s on %s #%llu, %s #%llu)", name, what,
                  KIND_NAMES[a->kind], fn, name, o->id, KIND_NAMES[a->kind], a->id);
        }
    }
    return o;
}

static void lock(void) { pthread_mutex_lock(&g_lock); }
static void unlock(void) { pthread_mutex_unlock(&g_lock); }

/* ---- objects -------------------------------------------------------------- */

static struct rt_object *new_object(int kind, struct rt_object *parent) {
    struct rt_object *o = calloc(1, sizeof(struct rt_object));
    if (!o) fatal("out of memory creating a %s", KIND_NAMES[kind]);
    o->magic = KIND_MAGIC[kind];
    o->kind = kind;
    o->parent = parent;
    o->id = g_next_id++;
    o->owner = getpid();
    o->program = -1;
    o->slot = -1;
    if (g_shared) {
        long slot = __atomic_fetch_add(&g_shared->next_slot, 1, __ATOMIC_SEQ_CST);
        if (slot < SHARED_SLOTS) {
            o->slot = slot;
            shared_set(slot, (int)getpid());
        }
    }
    set_add(o);
    g_live[kind]++;
    if (parent) parent->children++;
    return o;
}

/* Mark `o` released (called with g_lock held, after the checks). */
static void bury(struct rt_object *o) {
    o->magic = MAGIC_DEAD;
    shared_set(o->slot, -(int)getpid());
    if (o->owner == getpid()) {
        g_live[o->kind]--;
    } else {
        g_inherited--; /* released in a process that inherited it: the parent's is gone now */
    }
    if (o->parent) o->parent->children--;
    if (o->children > 0)
        warn("%s #%llu released while %d child object(s) are still alive; they are orphans "
             "now and any use or release of them aborts",
             KIND_NAMES[o->kind], o->id, o->children);
    free(o->data);
    o->data = NULL;
}

/*
 * Under AddressSanitizer a released object is freed (ASan itself then reports any later
 * use of it) and the object set is freed at unload, so that LeakSanitizer sees exactly
 * the objects that were never released.  Otherwise released objects are kept, marked
 * dead, so that a use after release is caught with a clear message.
 */
#if defined(__SANITIZE_ADDRESS__)
#define LAB_FREE_RELEASED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LAB_FREE_RELEASED 1
#endif
#endif

static void forget(struct rt_object *o) {
#ifdef LAB_FREE_RELEASED
    free(o);
#else
    (void)o;
#endif
}

static int release_object(const void *ptr, int kind, const char *fn) {
    lock();
    struct rt_object *o = check_object(ptr, kind, fn, 1);
    bury(o);
    forget(o);
    unlock();
    return RT_OK;
}

/* ---- runtime ---------------------------------------------------------------- */

const char *rt_version(void) { return RT_VERSION; }

int rt_init(const char *compiler_path) {
    lock();
    check_runtime("rt_init");
    if (g_initialized) {
        unlock();
        return RT_ERR_STATE;
    }
    if (compiler_path != NULL) {
        /* Borrow: find the copy the host loaded, resolve, drop our lookup reference. */
        void *handle = dlopen(compiler_path, RTLD_NOW | RTLD_NOLOAD);
        if (handle == NULL) {
            unlock();
            return RT_ERR_COMPILER_NOT_LOADED;
        }
        void *create = dlsym(handle, "cc_program_create");
        void *release = dlsym(handle, "cc_program_release");
        dlclose(handle);
        if (create == NULL || release == NULL) {
            unlock();
            return RT_ERR_COMPILER_SYMBOLS;
        }
        /* POSIX guarantees object <-> function pointer round trips for dlsym. */
        memcpy(&g_cc_create, &create, sizeof create);
        memcpy(&g_cc_release, &release, sizeof release);
    }
    g_initialized = 1;
    unlock();
    return RT_OK;
}

static void logger_stop_and_join(void);

int rt_shutdown(void) {
    lock();
    check_runtime("rt_shutdown");
    if (g_filters > 0) {
        int n = g_filters;
        unlock();
        fatal("rt_shutdown() while rt_filter is running on another thread (%d call(s) in "
              "progress)", n);
    }
    unlock();
    logger_stop_and_join();
    lock();
    check_runtime("rt_shutdown");
    g_torn_down = RT_TORN_DOWN_SHUTDOWN;
    g_teardown_what = "rt_shutdown()";
    unlock();
    return RT_OK;
}

/* ---- instance --------------------------------------------------------------- */

rt_instance *rt_instance_create(void) {
    lock();
    check_runtime("rt_instance_create");
    struct rt_object *o = new_object(RT_KIND_INSTANCE, NULL);
    unlock();
    return (rt_instance *)o;
}

int rt_instance_release(rt_instance *instance) {
    return release_object(instance, RT_KIND_INSTANCE, "rt_instance_release");
}

int rt_instance_device_count(rt_instance *instance) {
    lock();
    struct rt_object *o = check_object(instance, RT_KIND_INSTANCE, "rt_instance_device_count", 0);
    int n = o->children;
    unlock();
    return n;
}

/* ---- device ----------------------------------------------------------------- */

rt_device *rt_device_create(rt_instance *instance) {
    lock();
    struct rt_object *parent = check_object(instance, RT_KIND_INSTANCE, "rt_device_create", 0);
    struct rt_object *o = new_object(RT_KIND_DEVICE, parent);
    int (*create)(unsigned long long) = g_cc_create;
    unsigned long long id = o->id;
    unlock();
    if (create != NULL) {
        int program = create(id); /* into the compiler: crashes if it was unloaded */
        lock();
        o->program = program;
        unlock();
    }
    return (rt_device *)o;
}

int rt_device_release(rt_device *device) {
    lock();
    struct rt_object *o = check_object(device, RT_KIND_DEVICE, "rt_device_release", 1);
    if (o->running) {
        unlock();
        fatal("device #%llu released while rt_device_run is running on it (%d call(s) in "
              "progress on another thread)", o->id, o->running);
    }
    if (o->waiters) {
        unlock();
        fatal("device #%llu released while rt_device_wait is blocked on it (%d thread(s) "
              "waiting)", o->id, o->waiters);
    }
    int lost = o->lost;
    int program = o->program;
    int (*release)(int) = g_cc_release;
    unlock();
    if (lost) {
        /* A lost device: the driver never answers.  Block forever, holding no lock. */
        for (;;) sleep(3600);
    }
    if (program >= 0 && release != NULL) {
        release(program); /* into the compiler: SIGSEGV if its code was unmapped */
    }
    lock();
    o = check_object(device, RT_KIND_DEVICE, "rt_device_release", 1);
    bury(o);
    forget(o);
    unlock();
    return RT_OK;
}

int rt_device_submit(rt_device *device) {
    lock();
    struct rt_object *o = check_object(device, RT_KIND_DEVICE, "rt_device_submit", 0);
    int n = ++o->submits;
    unlock();
    return n;
}

int rt_device_run(rt_device *device, unsigned int ms) {
    lock();
    struct rt_object *o = check_object(device, RT_KIND_DEVICE, "rt_device_run", 0);
    o->running++;
    unlock();
    struct timespec slice = {0, 1000000}; /* 1 ms */
    for (unsigned int i = 0; i < ms; i++) {
        nanosleep(&slice, NULL);
    }
    lock();
    o = check_object(device, RT_KIND_DEVICE, "rt_device_run", 0);
    o->running--;
    unlock();
    return RT_OK;
}

int rt_device_running(rt_device *device) {
    lock();
    struct rt_object *o = check_object(device, RT_KIND_DEVICE, "rt_device_running", 0);
    int n = o->running;
    unlock();
    return n;
}

int rt_device_wait(rt_device *device) {
    lock();
    struct rt_object *o = check_object(device, RT_KIND_DEVICE, "rt_device_wait", 0);
    o->waiters++;
    while (!o->woken) pthread_cond_wait(&g_wake, &g_lock);
    o->waiters--;
    unlock();
    return 1;
}

int rt_device_wake(rt_device *device) {
    lock();
    struct rt_object *o = check_object(device, RT_KIND_DEVICE, "rt_device_wake", 0);
    o->woken = 1;
    pthread_cond_broadcast(&g_wake);
    unlock();
    return RT_OK;
}

int rt_device_waiting(rt_device *device) {
    lock();
    struct rt_object *o = check_object(device, RT_KIND_DEVICE, "rt_device_waiting", 0);
    int n = o->waiters;
    unlock();
    return n;
}

int rt_device_lose(rt_device *device) {
    lock();
    struct rt_object *o = check_object(device, RT_KIND_DEVICE, "rt_device_lose", 0);
    o->lost = 1;
    unlock();
    return RT_OK;
}

int rt_device_program(rt_device *device) {
    lock();
    struct rt_object *o = check_object(device, RT_KIND_DEVICE, "rt_device_program", 0);
    int program = o->program;
    unlock();
    return program;
}

/* ---- buffer ----------------------------------------------------------------- */

rt_buffer *rt_buffer_create(rt_device *device, size_t size) {
    lock();
    struct rt_object *parent = check_object(device, RT_KIND_DEVICE, "rt_buffer_create", 0);
    unsigned char *data = calloc(size ? size : 1, 1);
    if (!data) fatal("out of memory creating a buffer of %zu bytes", size);
    struct rt_object *o = new_object(RT_KIND_BUFFER, parent);
    o->size = size;
    o->data = data;
    unlock();
    return (rt_buffer *)o;
}

int rt_buffer_release(rt_buffer *buffer) {
    return release_object(buffer, RT_KIND_BUFFER, "rt_buffer_release");
}

size_t rt_buffer_size(rt_buffer *buffer) {
    lock();
    struct rt_object *o = check_object(buffer, RT_KIND_BUFFER, "rt_buffer_size", 0);
    size_t size = o->size;
    unlock();
    return size;
}

int rt_buffer_write(rt_buffer *buffer, size_t offset, const void *data, size_t size) {
    lock();
    struct rt_object *o = check_object(buffer, RT_KIND_BUFFER, "rt_buffer_write", 0);
    if (offset > o->size || size > o->size - offset || (size && data == NULL)) {
        unlock();
        return RT_ERR_RANGE;
    }
    if (size) memcpy(o->data + offset, data, size);
    unlock();
    return RT_OK;
}

int rt_buffer_read(rt_buffer *buffer, size_t offset, void *out, size_t size) {
    lock();
    struct rt_object *o = check_object(buffer, RT_KIND_BUFFER, "rt_buffer_read", 0);
    if (offset > o->size || size > o->size - offset || (size && out == NULL)) {
        unlock();
        return RT_ERR_RANGE;
    }
    if (size) memcpy(out, o->data + offset, size);
    unlock();
    return RT_OK;
}

/* ---- catalog ---------------------------------------------------------------- */

rt_catalog *rt_catalog_create(void) {
    lock();
    check_runtime("rt_catalog_create");
    struct rt_object *o = new_object(RT_KIND_CATALOG, NULL);
    unlock();
    return (rt_catalog *)o;
}

int rt_catalog_release(rt_catalog *catalog) {
    return release_object(catalog, RT_KIND_CATALOG, "rt_catalog_release");
}

int rt_catalog_count(rt_catalog *catalog) {
    lock();
    check_object(catalog, RT_KIND_CATALOG, "rt_catalog_count", 0);
    unlock();
    return (int)(sizeof CATALOG_ENTRIES / sizeof CATALOG_ENTRIES[0]);
}

const char *rt_catalog_name(rt_catalog *catalog, int index) {
    lock();
    check_object(catalog, RT_KIND_CATALOG, "rt_catalog_name", 0);
    unlock();
    if (index < 0 || index >= (int)(sizeof CATALOG_ENTRIES / sizeof CATALOG_ENTRIES[0]))
        return NULL;
    return CATALOG_ENTRIES[index];
}

/* ---- stateless functions ------------------------------------------------------ */

int rt_filter(unsigned int ms) {
    lock();
    check_runtime("rt_filter");
    g_filters++;
    unlock();
    struct timespec slice = {0, 1000000}; /* 1 ms */
    for (unsigned int i = 0; i < ms; i++) {
        nanosleep(&slice, NULL);
    }
    lock();
    g_filters--;
    unlock();
    return RT_OK;
}

int rt_filters_running(void) {
    lock();
    int n = g_filters;
    unlock();
    return n;
}

/* ---- logger ----------------------------------------------------------------- */

static void *logger_main(void *arg) {
    (void)arg;
    char message[96];
    unsigned long long tick = 0;
    for (;;) {
        if (__atomic_load_n(&g_log_stop, __ATOMIC_SEQ_CST)) break;
        rt_log_fn fn = __atomic_load_n(&g_log_fn, __ATOMIC_SEQ_CST);
        if (fn != NULL) {
            snprintf(message, sizeof message, "exitsafe-lab logger tick %llu", ++tick);
            fn(0, message); /* no lock held: the callback may call the runtime */
            __atomic_add_fetch(&g_log_calls, 1, __ATOMIC_SEQ_CST);
        }
        struct timespec ts;
        ts.tv_sec = g_log_interval_us / 1000000u;
        ts.tv_nsec = (long)(g_log_interval_us % 1000000u) * 1000L;
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    return NULL;
}

int rt_logger_register(rt_log_fn fn, unsigned int interval_us) {
    lock();
    check_runtime("rt_logger_register");
    if (fn == NULL) fatal("rt_logger_register: NULL callback");
    if (g_log_registered) {
        unlock();
        return RT_ERR_STATE;
    }
    g_log_interval_us = interval_us ? interval_us : 1000u;
    __atomic_store_n(&g_log_stop, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_log_fn, fn, __ATOMIC_SEQ_CST);
    int err = pthread_create(&g_log_thread, NULL, logger_main, NULL);
    if (err != 0) fatal("rt_logger_register: pthread_create failed: %s", strerror(err));
    g_log_registered = 1;
    unlock();
    return RT_OK;
}

/* Stop the logger thread and wait for it; afterwards the callback is never called. */
static void logger_stop_and_join(void) {
    lock();
    if (!g_log_registered) {
        unlock();
        return;
    }
    if (pthread_equal(pthread_self(), g_log_thread))
        fatal("the logger was unregistered from its own callback (it would wait for itself)");
    pthread_t thread = g_log_thread;
    g_log_registered = 0;
    __atomic_store_n(&g_log_stop, 1, __ATOMIC_SEQ_CST);
    unlock();
    pthread_join(thread, NULL);
    __atomic_store_n(&g_log_fn, (rt_log_fn)NULL, __ATOMIC_SEQ_CST);
}

int rt_logger_unregister(void) {
    lock();
    check_runtime("rt_logger_unregister");
    int registered = g_log_registered;
    unlock();
    if (!registered) return RT_ERR_STATE;
    logger_stop_and_join();
    return RT_OK;
}

unsigned long long rt_logger_calls(void) { return __atomic_load_n(&g_log_calls, __ATOMIC_SEQ_CST); }

/* ---- introspection and the leak report ---------------------------------------- */

int rt_live(int kind) {
    if (kind < 0 || kind >= KIND_COUNT) return RT_ERR_RANGE;
    lock();
    int n = g_live[kind];
    unlock();
    return n;
}

int rt_inherited(void) {
    lock();
    int n = g_inherited;
    unlock();
    return n;
}

int rt_torn_down(void) {
    lock();
    int state = g_torn_down;
    unlock();
    return state;
}

static const char *teardown_word(int state) {
    switch (state) {
        case RT_TORN_DOWN_SHUTDOWN: return "shutdown";
        case RT_TORN_DOWN_UNLOAD: return "unload";
        default: return "live";
    }
}

/* Format the report (caller holds the lock, or gave up waiting for it at exit). */
static int format_report(char *out, size_t size) {
    return snprintf(out, size,
                    "exitsafe-lab leak report: pid=%d forked=%d instances=%d devices=%d "
                    "buffers=%d catalogs=%d inherited=%d teardown=%s logger=%d\n",
                    (int)getpid(), getpid() != g_load_pid, g_live[RT_KIND_INSTANCE],
                    g_live[RT_KIND_DEVICE], g_live[RT_KIND_BUFFER], g_live[RT_KIND_CATALOG],
                    g_inherited, teardown_word(g_torn_down), g_log_registered);
}

int rt_leak_report(char *out, size_t size) {
    lock();
    int n = format_report(out, size);
    unlock();
    return n;
}

/* ---- process hooks ------------------------------------------------------------ */

static void atfork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&g_lock); }

static void atfork_child(void) {
    pthread_mutex_init(&g_lock, NULL);
    pthread_cond_init(&g_wake, NULL);
    g_filters = 0; /* the threads inside rt_filter do not exist in the child */
    /* Everything alive now was created by an ancestor: inherited, not ours. */
    for (int k = 0; k < KIND_COUNT; k++) {
        g_inherited += g_live[k];
        g_live[k] = 0;
    }
    /* The logger thread does not exist in the child. */
    g_log_registered = 0;
    __atomic_store_n(&g_log_fn, (rt_log_fn)NULL, __ATOMIC_SEQ_CST);
}

__attribute__((constructor)) static void rt_load(void) {
    g_load_pid = getpid();
    void *mem = mmap(NULL, sizeof(struct shared_table), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    g_shared = mem == MAP_FAILED ? NULL : (struct shared_table *)mem;
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static void write_report(const char *line, size_t len) {
    const char *path = getenv("EXITSAFE_LAB_LEAK_REPORT");
    if (path != NULL && path[0] != '\0') {
        int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            write_all(fd, line, len); /* one O_APPEND write: lines never interleave */
            close(fd);
            return;
        }
    }
    write_all(2, line, len);
}

/*
 * The library destructor: runs when the library is unloaded (last dlclose)
 * or when the process exits.  It marks the runtime torn down (any later call
 * aborts), writes the leak report, and, like a real runtime logging from its
 * static destructors, tells a still-registered logger that it is unloading.
 */
__attribute__((destructor)) static void rt_unload(void) {
    /* Another thread may be inside the runtime: wait a little, never forever. */
    int locked = 0;
    for (int i = 0; i < 500 && !locked; i++) {
        if (pthread_mutex_trylock(&g_lock) == 0) {
            locked = 1;
        } else {
            struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (g_torn_down == RT_LIVE) {
        g_torn_down = RT_TORN_DOWN_UNLOAD;
        g_teardown_what = "the library was unloaded (its destructor ran)";
    }
    char line[256];
    int n = format_report(line, sizeof line);
    int leaks = g_live[0] + g_live[1] + g_live[2] + g_live[3];
    rt_log_fn fn = __atomic_load_n(&g_log_fn, __ATOMIC_SEQ_CST);
    int logger = g_log_registered;
    pthread_t thread = g_log_thread;
    g_log_registered = 0;
    __atomic_store_n(&g_log_stop, 1, __ATOMIC_SEQ_CST);
    if (locked) pthread_mutex_unlock(&g_lock);

    if (n > 0) write_report(line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);

    if (logger && fn != NULL) {
#ifdef __GLIBC__
        /* Give the thread a moment to leave our code (it may be stuck in its callback). */
        struct timespec limit;
        clock_gettime(CLOCK_REALTIME, &limit);
        limit.tv_nsec += 200000000L;
        if (limit.tv_nsec >= 1000000000L) {
            limit.tv_sec += 1;
            limit.tv_nsec -= 1000000000L;
        }
        pthread_timedjoin_np(thread, NULL, &limit);
#else
        (void)thread;
#endif
        fn(2, "exitsafe-lab runtime unloading with the logger still registered");
    }

#ifdef LAB_FREE_RELEASED
    free(g_set);
    g_set = NULL;
    g_set_cap = g_set_len = 0;
#endif

    const char *code = getenv("EXITSAFE_LAB_LEAK_EXITCODE");
    if (leaks > 0 && code != NULL && code[0] != '\0' ) {
        int status = atoi(code);
        if (status > 0 && status < 256) _exit(status);
    }
}
