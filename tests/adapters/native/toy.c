#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "toy.h"

#define CTX_MAGIC 0x43545821u
#define OBJ_MAGIC 0x4f424a21u
#define CAT_MAGIC 0x43415421u
#define DEAD_MAGIC 0xdeaddeadu

struct toy_ctx { unsigned magic; int id; int children; };
struct toy_obj { unsigned magic; int id; toy_ctx *ctx; };
struct toy_catalog { unsigned magic; int id; };

static int next_id = 1, live_ctx = 0, live_obj = 0, live_cat = 0, shut_down = 0;
static volatile toy_log_fn logger = 0;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void trace(const char *fmt, ...) {
    if (!getenv("TOY_TRACE")) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("toy: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
    va_end(ap);
}

static void fatal(const char *msg) {
    fprintf(stderr, "toy FATAL: %s\n", msg);
    fflush(stderr);
    abort();
}

/* Memory of freed objects is never returned, so later checks stay well defined. */
toy_ctx *toy_ctx_new(void) {
    toy_ctx *c = calloc(1, sizeof *c);
    pthread_mutex_lock(&mu);
    c->magic = CTX_MAGIC; c->id = next_id++; live_ctx++;
    pthread_mutex_unlock(&mu);
    trace("new ctx %d", c->id);
    return c;
}

void toy_ctx_free(toy_ctx *c) {
    if (!c || c->magic != CTX_MAGIC) fatal("toy_ctx_free: not a live context (double free?)");
    if (c->children) fatal("toy_ctx_free: context freed while its objects are alive (free children first)");
    pthread_mutex_lock(&mu);
    c->magic = DEAD_MAGIC; live_ctx--;
    pthread_mutex_unlock(&mu);
    trace("free ctx %d", c->id);
}

toy_obj *toy_obj_new(toy_ctx *c) {
    if (!c || c->magic != CTX_MAGIC) fatal("toy_obj_new: not a live context");
    toy_obj *o = calloc(1, sizeof *o);
    pthread_mutex_lock(&mu);
    o->magic = OBJ_MAGIC; o->id = next_id++; o->ctx = c; c->children++; live_obj++;
    pthread_mutex_unlock(&mu);
    trace("new obj %d", o->id);
    return o;
}

void toy_obj_free(toy_obj *o) {
    if (!o || o->magic != OBJ_MAGIC) fatal("toy_obj_free: not a live object (double free?)");
    if (o->ctx->magic != CTX_MAGIC) fatal("toy_obj_free: object freed after its context");
    pthread_mutex_lock(&mu);
    o->magic = DEAD_MAGIC; o->ctx->children--; live_obj--;
    pthread_mutex_unlock(&mu);
    trace("free obj %d", o->id);
}

int toy_obj_id(toy_obj *o) {
    if (!o || o->magic != OBJ_MAGIC) fatal("toy_obj_id: not a live object (use after free?)");
    return o->id;
}

int toy_live(void) { return live_ctx + live_obj + live_cat; }

void toy_set_logger(toy_log_fn fn) { logger = fn; }

void toy_log(const char *msg) {
    toy_log_fn fn = logger;
    if (fn) fn(msg);
}

static void *logger_main(void *arg) {
    int interval = *(int *)arg;
    free(arg);
    for (;;) {
        toy_log_fn fn = logger;
        if (fn) fn("tick");
        usleep(interval);
    }
    return 0;
}

int toy_logger_thread_start(int interval_us) {
    pthread_t t;
    int *arg = malloc(sizeof *arg);
    *arg = interval_us;
    if (pthread_create(&t, 0, logger_main, arg) != 0) return -1;
    pthread_detach(t);
    return 0;
}

int toy_call(toy_int_fn fn, int x) { return fn(x); }

toy_catalog *toy_catalog_open(void) {
    toy_catalog *cat = calloc(1, sizeof *cat);
    cat->magic = CAT_MAGIC; cat->id = next_id++; live_cat++;
    trace("open catalog %d", cat->id);
    return cat;
}

void toy_catalog_release(toy_catalog *cat) {
    if (!cat || cat->magic != CAT_MAGIC) fatal("toy_catalog_release: not a live catalog");
    if (shut_down) fatal("toy_catalog_release: catalog released after toy_runtime_shutdown()");
    cat->magic = DEAD_MAGIC; live_cat--;
    trace("release catalog %d", cat->id);
}

void toy_runtime_shutdown(void) { shut_down = 1; trace("runtime shutdown"); }

__attribute__((destructor)) static void toy_unload(void) {
    if (getenv("TOY_REPORT")) {
        fprintf(stderr, "toy: unloaded with %d live objects\n", toy_live());
        fflush(stderr);
    }
}
