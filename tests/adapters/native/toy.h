/* A tiny native runtime for the exitsafe adapter tests.
 * Contexts own objects; every call validates magic numbers and aborts with a
 * "toy FATAL:" message naming the rule broken (never undefined behaviour). */
typedef struct toy_ctx toy_ctx;
typedef struct toy_obj toy_obj;
typedef struct toy_catalog toy_catalog;
typedef void (*toy_log_fn)(const char *msg);
typedef int (*toy_int_fn)(int x);

toy_ctx *toy_ctx_new(void);
void toy_ctx_free(toy_ctx *ctx);
toy_obj *toy_obj_new(toy_ctx *ctx);
void toy_obj_free(toy_obj *obj);
int toy_obj_id(toy_obj *obj);
int toy_live(void);

void toy_set_logger(toy_log_fn fn);
void toy_log(const char *msg);
int toy_logger_thread_start(int interval_us);
int toy_call(toy_int_fn fn, int x);

toy_catalog *toy_catalog_open(void);
void toy_catalog_release(toy_catalog *cat);
void toy_runtime_shutdown(void);
