/*
 * exitsafe lab: the test runtime and its compiler dependency.
 *
 * Two shared libraries, built by exitsafe.lab.build and loaded with cffi's
 * ABI mode (exitsafe.lab.shim):
 *
 *   libexitsafe_lab_runtime.so   instance -> device -> buffer objects, a
 *                                catalog, a logger thread, lost devices,
 *                                teardown and the leak report.
 *   libexitsafe_lab_compiler.so  "shader compiler" programs; the runtime
 *                                calls it while creating and releasing
 *                                devices.
 *
 * Every rule the runtime can check it checks, and a broken rule prints one
 * line "FATAL: <rule broken> ..." on stderr and calls abort().  See
 * README.md next to this file for the rules and the leak report format.
 *
 * Keep the declarations below in sync with exitsafe/lab/shim.py (CDEF);
 * tests/lab/test_native.py checks that every function declared here is in
 * the cdef.
 */
#ifndef EXITSAFE_LAB_H
#define EXITSAFE_LAB_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime ---------------------------------------------------------- */

typedef struct rt_instance rt_instance;
typedef struct rt_device rt_device;
typedef struct rt_buffer rt_buffer;
typedef struct rt_catalog rt_catalog;

/* Object kinds, for rt_live(). */
#define RT_KIND_INSTANCE 0
#define RT_KIND_DEVICE 1
#define RT_KIND_BUFFER 2
#define RT_KIND_CATALOG 3

/* Return codes of the functions returning int (errors are negative). */
#define RT_OK 0
#define RT_ERR_STATE (-1)               /* wrong call order (documented per function) */
#define RT_ERR_COMPILER_NOT_LOADED (-2) /* rt_init: the host has not loaded the compiler */
#define RT_ERR_COMPILER_SYMBOLS (-3)    /* rt_init: the library is not the lab compiler */
#define RT_ERR_RANGE (-4)               /* buffer access out of range, bad index */

/* Teardown states returned by rt_torn_down(). */
#define RT_LIVE 0
#define RT_TORN_DOWN_SHUTDOWN 1 /* rt_shutdown() was called */
#define RT_TORN_DOWN_UNLOAD 2   /* the library destructor ran (unload or exit) */

typedef void (*rt_log_fn)(int level, const char *message);

const char *rt_version(void);

/* Borrow the compiler library already loaded by the host (see README.md). */
int rt_init(const char *compiler_path);
/* Tear the runtime down now: stops the logger, then every later call aborts. */
int rt_shutdown(void);

rt_instance *rt_instance_create(void);
int rt_instance_release(rt_instance *instance);
int rt_instance_device_count(rt_instance *instance);

rt_device *rt_device_create(rt_instance *instance);
int rt_device_release(rt_device *device);
int rt_device_submit(rt_device *device);
int rt_device_lose(rt_device *device);
int rt_device_program(rt_device *device);
/* A long native call (an inference, a kernel): works for `ms` milliseconds.  Releasing
   the device while a run is in progress on it aborts. */
int rt_device_run(rt_device *device, unsigned int ms);
/* How many rt_device_run calls are in progress on the device right now. */
int rt_device_running(rt_device *device);
/* Block until rt_device_wake is called on the device (an event pump's wait), then return
   1 ("woken"); once woken, every later wait returns 1 at once.  Releasing the device while
   a thread waits on it aborts. */
int rt_device_wait(rt_device *device);
/* Wake every thread waiting on the device, for good. */
int rt_device_wake(rt_device *device);
/* How many threads are blocked in rt_device_wait on the device right now. */
int rt_device_waiting(rt_device *device);

rt_buffer *rt_buffer_create(rt_device *device, size_t size);
int rt_buffer_release(rt_buffer *buffer);
size_t rt_buffer_size(rt_buffer *buffer);
int rt_buffer_write(rt_buffer *buffer, size_t offset, const void *data, size_t size);
int rt_buffer_read(rt_buffer *buffer, size_t offset, void *out, size_t size);

rt_catalog *rt_catalog_create(void);
int rt_catalog_release(rt_catalog *catalog);
int rt_catalog_count(rt_catalog *catalog);
const char *rt_catalog_name(rt_catalog *catalog, int index);

/* A stateless native function (no object, like an image filter): works for `ms`
   milliseconds.  rt_shutdown() while a call is in progress aborts. */
int rt_filter(unsigned int ms);
/* How many rt_filter calls are in progress right now (allowed at any time). */
int rt_filters_running(void);

int rt_logger_register(rt_log_fn fn, unsigned int interval_us);
int rt_logger_unregister(void);

/* Introspection: allowed at any time, even after teardown. */
int rt_live(int kind);
int rt_inherited(void);
int rt_torn_down(void);
unsigned long long rt_logger_calls(void);
int rt_leak_report(char *out, size_t size);

/* ---- compiler --------------------------------------------------------- */

const char *cc_version(void);
int cc_program_create(unsigned long long device_id);
int cc_program_release(int program);
int cc_live_programs(void);

#ifdef __cplusplus
}
#endif

#endif /* EXITSAFE_LAB_H */
