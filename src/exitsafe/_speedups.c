/* exitsafe._speedups: the optional compiled core of exitsafe's hot path.
 *
 * What lives here (and nothing else):
 *   - Lock: the one lock of exitsafe (exitsafe._sync.LOCK), an owner-aware lock whose
 *     state the hot paths below read and take without a Python call.
 *   - Node: the handle record (the base of exitsafe._record.Record); its fields are the
 *     same attributes the pure-Python record has (``node._refs`` ...).  The C code below
 *     mirrors the hot transitions of exitsafe._record (claim, end released, add and drop
 *     an owner) field for field; the Python layers make every other transition.
 *   - RegistryCore: the base of exitsafe._state.RegistryState, holding the fields the hot
 *     path needs (phase, seq, cap, live, records, strict).
 *   - RegistryBase: the base of the public exitsafe.Registry, a facade holding its state;
 *     its track() is the compiled one.
 *   - The common cases of Registry.track, Handle.release, Handle.retain and the garbage
 *     collection of a handle (tp_finalize).  Every other case (dependencies, policies,
 *     names, a teardown begun, re-entry from a finalizer, a contended lock, affinity,
 *     inherited handles, strict mode...) is handed to the pure-Python implementation,
 *     which checks everything again from scratch: the fast paths change nothing before
 *     they hand over.
 *
 * The lock discipline is exitsafe._sync's: a section is bookkeeping only and never
 * waits; re-entry (the lock already held by this thread) goes to the Python path, which
 * queues the request.  Release functions run outside the lock.
 *
 * Free-threaded builds: the compiled core is not used there.  No free-threaded CPython
 * has run it in CI, so PyInit__speedups refuses (ImportError) and exitsafe._core runs the
 * pure-Python core, whose one lock guards every field.  The relaxed atomics below (the
 * fields the fast paths read before taking the lock: a registry's phase, the lock's
 * owner) are the design it was written to, kept for the day such a lane runs it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>
#include <time.h>

#if defined(__GNUC__) || defined(__clang__)
#define LOAD(p) __atomic_load_n(&(p), __ATOMIC_RELAXED)
#define STORE(p, v) __atomic_store_n(&(p), (v), __ATOMIC_RELAXED)
#else
#define LOAD(p) (p)
#define STORE(p, v) ((p) = (v))
#endif

/* States and roles: the same numbers as exitsafe._node. */
#define LIVE 0
#define RELEASING 1
#define RELEASED 2
#define HOOK_ROLE 0
#define HANDLE_ROLE 1
#define LIBRARY_ROLE 2
#define PHASE_OPEN 0

/* Py_NewRef (3.10+) for 3.9 */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *
exitsafe_new_ref(PyObject *op)
{
    Py_INCREF(op);
    return op;
}
#define Py_NewRef(op) exitsafe_new_ref((PyObject *)(op))
#endif

/* Name_traverse, Name_clear and Name_dealloc of a garbage-collected type whose references
 * are exactly the object fields FIELDS lists (X(field) each, visited and cleared in that
 * order); GC_DEALLOC alone for a type with its own clear. */
#define VISIT_FIELD(field) Py_VISIT(self->field);
#define CLEAR_FIELD(field) Py_CLEAR(self->field);
#define GC_DEALLOC(Name, Type)                                                              \
    static void Name##_dealloc(Type *self)                                                  \
    {                                                                                       \
        PyObject_GC_UnTrack(self);                                                          \
        Name##_clear(self);                                                                 \
        Py_TYPE(self)->tp_free((PyObject *)self);                                           \
    }
#define GC_SLOTS(Name, Type, FIELDS)                                                        \
    static int Name##_traverse(Type *self, visitproc visit, void *arg)                      \
    {                                                                                       \
        FIELDS(VISIT_FIELD)                                                                 \
        return 0;                                                                           \
    }                                                                                       \
    static int Name##_clear(Type *self)                                                     \
    {                                                                                       \
        FIELDS(CLEAR_FIELD)                                                                 \
        return 0;                                                                           \
    }                                                                                       \
    GC_DEALLOC(Name, Type)

/* ------------------------------------------------------------------ Lock */

/* The lock is one word, its owner's thread ident (0: free), taken by compare-and-swap.
 * A thread that finds it taken does not queue on an OS lock: sections never wait and
 * are short (exitsafe._sync's rules), so it sleeps in growing steps (20 us to 1 ms, the
 * GIL released) and tries again, running signal handlers in between as threading's
 * locks do. */
typedef struct {
    PyObject_HEAD
    unsigned long owner; /* thread ident of the holder, 0 if none (atomic) */
    long count;          /* re-entry depth of the holder (touched by the holder only) */
} LockObject;

static PyTypeObject LockType;

static inline int
lock_try(LockObject *lock, unsigned long me)
{
#if defined(__GNUC__) || defined(__clang__)
    unsigned long expected = 0;
    if (__atomic_compare_exchange_n(&lock->owner, &expected, me, 0, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED)) {
#else
#error "exitsafe._speedups needs GCC or Clang atomics"
    {
#endif
        lock->count = 1;
        return 1;
    }
    return 0;
}

static inline void
lock_drop(LockObject *lock)
{
    lock->count = 0;
    __atomic_store_n(&lock->owner, 0UL, __ATOMIC_RELEASE);
}

static double
monotonic_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static PyObject *
Lock_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if ((args && PyTuple_GET_SIZE(args)) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Lock() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static void
Lock_dealloc(LockObject *self)
{
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* acquire(blocking=True, timeout=-1) -> bool, like threading.RLock.acquire. */
static PyObject *
Lock_acquire(LockObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pd:acquire", kwlist, &blocking, &timeout)) {
        return NULL;
    }
    if (!blocking && timeout != -1.0) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1.0) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    unsigned long me = PyThread_get_thread_ident();
    if (LOAD(self->owner) == me) {
        self->count++;
        Py_RETURN_TRUE;
    }
    if (lock_try(self, me)) {
        Py_RETURN_TRUE;
    }
    if (!blocking) {
        Py_RETURN_FALSE;
    }
    double deadline = timeout < 0 ? 0.0 : monotonic_seconds() + timeout;
    long step_ns = 20000;
    for (;;) {
        double left = 0.0;
        if (timeout >= 0) {
            left = deadline - monotonic_seconds();
            if (left <= 0) {
                Py_RETURN_FALSE;
            }
        }
        struct timespec pause = {0, step_ns};
        if (timeout >= 0 && left * 1e9 < (double)step_ns) {
            pause.tv_nsec = (long)(left * 1e9) + 1;
        }
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&pause, NULL);
        Py_END_ALLOW_THREADS
        if (lock_try(self, me)) {
            Py_RETURN_TRUE;
        }
        if (step_ns < 1000000) {
            step_ns *= 2;
        }
        /* Run the signal handlers (main thread), as threading's locks do. */
        if (PyErr_CheckSignals() < 0) {
            return NULL;
        }
    }
}

static PyObject *
Lock_release(LockObject *self, PyObject *Py_UNUSED(ignored))
{
    if (LOAD(self->owner) != PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return NULL;
    }
    if (--self->count == 0) {
        lock_drop(self);
    }
    Py_RETURN_NONE;
}

static PyObject *
Lock_is_owned(LockObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(LOAD(self->owner) == PyThread_get_thread_ident());
}

static PyObject *
Lock_locked(LockObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(LOAD(self->owner) != 0);
}

/* In a forked child: free again (the holder may be a thread that does not exist here). */
static PyObject *
Lock_at_fork_reinit(LockObject *self, PyObject *Py_UNUSED(ignored))
{
    self->count = 0;
    STORE(self->owner, 0UL);
    Py_RETURN_NONE;
}

static PyMethodDef Lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))Lock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1)\n--\n\nTake the lock; whether it was taken."},
    {"release", (PyCFunction)Lock_release, METH_NOARGS, "Release the lock."},
    {"_is_owned", (PyCFunction)Lock_is_owned, METH_NOARGS,
     "Whether the calling thread holds the lock."},
    {"locked", (PyCFunction)Lock_locked, METH_NOARGS, "Whether some thread holds the lock."},
    {"_at_fork_reinit", (PyCFunction)Lock_at_fork_reinit, METH_NOARGS,
     "Make the lock free again (in a forked child)."},
    {"__enter__", (PyCFunction)(void (*)(void))Lock_acquire, METH_VARARGS | METH_KEYWORDS, NULL},
    {"__exit__", (PyCFunction)Lock_release, METH_VARARGS, NULL}, /* (its arguments ignored) */
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exitsafe._speedups.Lock",
    .tp_basicsize = sizeof(LockObject),
    .tp_dealloc = (destructor)Lock_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "exitsafe's one lock: re-entrant, owner-aware (see exitsafe._sync).",
    .tp_methods = Lock_methods,
    .tp_new = Lock_new,
};

/* ------------------------------------------------------------------ module state */

/* Set once by setup() (exitsafe._registry at import); all strong references. */
static LockObject *the_lock;
static PyTypeObject *handle_type;
static PyTypeObject *registry_type; /* exitsafe._state.RegistryState */
static PyTypeObject *facade_type;   /* exitsafe.Registry itself (not a subclass) */
static PyObject *track_py, *drop_owner_py, *retain_py, *collected_py;
static PyObject *release_chain_py, *release_failed_py, *collected_failed_py;
static PyObject *registered_after_close_py, *undo_track_py;
static PyObject *sync_wait, *deferred_list, *run_deferred, *affine_dict, *run_mine;
static PyObject *released_str, *released_at_exit_str;
static Py_ssize_t generation; /* exitsafe._sync.generation, mirrored */

static PyObject *str_handle, *str_library, *str_trim, *str_ledger;
static PyObject *kw_kind, *kw_depends_on, *kw_exit_policy, *kw_name, *kw_timeout, *kw_affinity;
static PyObject *kw_registry, *kw_lib;

static int
ready(void)
{
    if (the_lock == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "exitsafe._speedups.setup() was not called");
        return 0;
    }
    return 1;
}

/* Take the lock: at once if free, else through exitsafe._sync.wait (yields, then blocks). */
static int
enter_section(unsigned long me)
{
    if (lock_try(the_lock, me)) {
        return 0;
    }
    PyObject *r = PyObject_CallNoArgs(sync_wait);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* After an exitsafe call: run queued work, then this thread's queued affine releases. */
static int
after_call(int affine)
{
    if (PyList_GET_SIZE(deferred_list)) {
        PyObject *r = PyObject_CallNoArgs(run_deferred);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    if (affine && PyDict_GET_SIZE(affine_dict)) {
        PyObject *r = PyObject_CallNoArgs(run_mine);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    return 0;
}

static PyObject *
call2(PyObject *fn, PyObject *a, PyObject *b)
{
    PyObject *args[2] = {a, b};
    return PyObject_Vectorcall(fn, args, 2, NULL);
}

static PyObject *take_exception(void);

/* Take the exception set into *first (a new reference) unless one is there already. */
static void
keep_first(PyObject **first)
{
    PyObject *exc = take_exception();
    if (*first == NULL) {
        *first = exc;
    }
    else {
        Py_XDECREF(exc);
    }
}

/* Call fn(*args) again while an interrupt stops it (KeyboardInterrupt, or the SystemExit of
 * exitsafe's signal handlers): the Python callbacks called this way finish what a claim or
 * a registration began (a release chain, the record of a failed release, undoing a
 * registration), and each may be called again.  The first interrupt is left in
 * *interrupt (a new reference) for the caller to raise once its own work is done; any
 * other error returns NULL. */
static PyObject *
call_until_done(PyObject *fn, PyObject *const *args, size_t nargs, PyObject **interrupt)
{
    for (;;) {
        PyObject *r = PyObject_Vectorcall(fn, args, nargs, NULL);
        if (r != NULL) {
            return r;
        }
        if (!PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)
            && !PyErr_ExceptionMatches(PyExc_SystemExit)) {
            return NULL;
        }
        keep_first(interrupt);
    }
}

static PyObject *
take_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) {
        PyException_SetTraceback(value, tb);
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

static void
raise_exception(PyObject *exc) /* steals exc */
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyObject *type = (PyObject *)Py_TYPE(exc);
    Py_INCREF(type);
    PyErr_Restore(type, exc, PyException_GetTraceback(exc));
#endif
}

/* enter_section() to record what already happened (a release function returned): an
 * interrupt while waiting (KeyboardInterrupt, or SystemExit from a signal handler) must
 * not lose the record.  Waits again (bounded: sections never wait) until it holds the
 * lock; the first interrupt is left in *interrupt (a new reference) for the caller to
 * raise once the record is made.  -1 with another error set (a RecursionError would come
 * back at every try), the lock not held. */
static int
enter_section_to_record(unsigned long me, PyObject **interrupt)
{
    while (enter_section(me) < 0) {
        int held = LOAD(the_lock->owner) == me; /* (raised once the wait had taken it) */
        if (!held && !PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)
            && !PyErr_ExceptionMatches(PyExc_SystemExit)) {
            Py_CLEAR(*interrupt);
            return -1;
        }
        keep_first(interrupt);
        if (held) {
            return 0;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ RegistryCore */

typedef struct {
    PyObject_HEAD
    int phase;          /* OPEN 0, TEARING_DOWN 1, CLOSED 2 (atomic reads) */
    Py_ssize_t seq;     /* the last creation number */
    Py_ssize_t cap;     /* trim the ledger's records beyond this many */
    PyObject *live;     /* the records not yet ended (a LiveTable) */
    PyObject *records;  /* the ledger's record list */
    PyObject *strict;   /* strict */
} RegistryObject;

static PyTypeObject RegistryType;

#define REGISTRY_FIELDS(X) X(live) X(records) X(strict)
GC_SLOTS(Registry, RegistryObject, REGISTRY_FIELDS)

static PyMemberDef Registry_members[] = {
    {"phase", T_INT, offsetof(RegistryObject, phase), 0, NULL},
    {"seq", T_PYSSIZET, offsetof(RegistryObject, seq), 0, NULL},
    {"cap", T_PYSSIZET, offsetof(RegistryObject, cap), 0, NULL},
    {"live", T_OBJECT, offsetof(RegistryObject, live), 0, NULL},
    {"records", T_OBJECT, offsetof(RegistryObject, records), 0, NULL},
    {"strict", T_OBJECT, offsetof(RegistryObject, strict), 0,
     "Whether misuse raises (see Registry)."},
    {NULL, 0, 0, 0, NULL},
};

/* ------------------------------------------------------------------ Node */

struct LiveTableObject;

typedef struct LiveLink {
    struct LiveLink *prev, *next;
} LiveLink;

/* The fields most handles leave None (a name, an exit policy, a timeout, a taint, a thread
 * affinity), kept out of the handle until one is set: every live handle is smaller by
 * four pointers.  Allocated by the first setter that stores something else than None,
 * freed with the handle. */
typedef struct {
    PyObject *name, *policy, *timeout, *taint, *affinity;
} NodeExtra;
#define NODE_EXTRA_FIELDS(X) X(name) X(policy) X(timeout) X(taint) X(affinity)

typedef struct {
    PyObject_HEAD
    PyObject *registry, *raw, *fn, *kind, *parents; /* NODE_FIELDS */
    NodeExtra *extra; /* NULL: all of its fields are None */
    /* Python ints, so that the pure-Python layers' attribute accesses of them are
     * specialized by CPython like those of __slots__ (only object members are); they hold
     * small values, CPython's shared small ints. */
    PyObject *refs, *children, *borrows, *state, *role;
    Py_ssize_t seq; /* creation number: a C integer, so no int object per handle */
    double rank;    /* topological rank (exitsafe._graph): seq, or between two ranks */
    PyObject *weaklist;
    LiveLink link;                  /* its place in its registry's LiveTable */
    struct LiveTableObject *table;  /* that table (borrowed), or NULL */
    unsigned long releaser, thread_id;
    int gen;                        /* the fork generation it was created in */
    char owned;                     /* whether the table holds a reference to it */
    char in_child;
} NodeObject;
#define NODE_FIELDS(X) X(registry) X(raw) X(fn) X(kind) X(parents)
#define NODE_INT_FIELDS(X) X(refs) X(children) X(borrows) X(state) X(role)

/* The integer fields: always ints written by exitsafe (NULL only before initialization).
 * The values the fast paths write (0 to 4) are CPython's cached small ints, kept in
 * `small`; reading compares with them before converting. */
#define SMALL_INTS 5
static PyObject *small[SMALL_INTS];

static inline long
ival(PyObject *o)
{
    if (o == small[0] || o == NULL) {
        return 0;
    }
    if (o == small[1]) {
        return 1;
    }
    return PyLong_AsLong(o);
}

static inline void
iset(PyObject **slot, long value) /* 0 <= value < SMALL_INTS */
{
    PyObject *old = *slot;
    Py_INCREF(small[value]);
    *slot = small[value];
    Py_XDECREF(old);
}

static inline void
iset_counter(PyObject **slot, long value) /* any value (owner counts) */
{
    if (value >= 0 && value < SMALL_INTS) {
        iset(slot, value);
    }
    else {
        Py_XSETREF(*slot, PyLong_FromLong(value));
    }
}

static PyTypeObject NodeType;

/* ------------------------------------------------------------------ LiveTable */

/* A registry's `_live`: its handles not yet ended, oldest first.  Handles are linked in
 * place (a doubly-linked list through the records themselves: adding and removing one
 * allocates nothing).  A handle is held *weakly* (its garbage collection means its owner
 * let go: dropping the last reference unlinks it), a hook *strongly* (owned until the
 * teardown).  Adding and removing happen under exitsafe's lock; a handle being destroyed
 * unlinks itself from any thread, so on free-threaded builds every link change is made
 * under `link_mutex` as well. */
typedef struct LiveTableObject {
    PyObject_HEAD
    LiveLink head; /* sentinel: head.next is the oldest */
    Py_ssize_t count;
} LiveTableObject;

static PyTypeObject LiveTableType;

#ifdef Py_GIL_DISABLED
static PyMutex link_mutex;
#define LINK_LOCK() PyMutex_Lock(&link_mutex)
#define LINK_UNLOCK() PyMutex_Unlock(&link_mutex)
#else
#define LINK_LOCK()
#define LINK_UNLOCK()
#endif

#define NODE_OF(lk) ((NodeObject *)((char *)(lk) - offsetof(NodeObject, link)))

/* Unlink `node` from its table; returns the node if the table owned it (the caller
 * drops that reference, outside any section), else NULL. */
static NodeObject *
live_unlink(NodeObject *node)
{
    NodeObject *owned = NULL;
    LINK_LOCK();
    LiveTableObject *table = node->table;
    if (table != NULL) {
        node->link.prev->next = node->link.next;
        node->link.next->prev = node->link.prev;
        node->link.prev = node->link.next = NULL;
        node->table = NULL;
        table->count--;
        if (node->owned) {
            node->owned = 0;
            owned = node;
        }
    }
    LINK_UNLOCK();
    return owned;
}

static void
live_append(LiveTableObject *table, NodeObject *node, int owned)
{
    if (owned) {
        Py_INCREF(node);
    }
#if defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030E0000
    else {
        /* held weakly: nodes() may meet it while another thread destroys it (see there) */
        PyUnstable_EnableTryIncRef((PyObject *)node);
    }
#endif
    LINK_LOCK();
    node->link.prev = table->head.prev;
    node->link.next = &table->head;
    table->head.prev->next = &node->link;
    table->head.prev = &node->link;
    node->table = table;
    node->owned = (char)owned;
    table->count++;
    LINK_UNLOCK();
}

static PyObject *
LiveTable_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if ((args && PyTuple_GET_SIZE(args)) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "LiveTable() takes no arguments");
        return NULL;
    }
    LiveTableObject *self = (LiveTableObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->head.prev = self->head.next = &self->head;
    }
    return (PyObject *)self;
}

static int
LiveTable_traverse(LiveTableObject *self, visitproc visit, void *arg)
{
    for (LiveLink *l = self->head.next; l != &self->head; l = l->next) {
        NodeObject *node = NODE_OF(l);
        if (node->owned) {
            Py_VISIT(node);
        }
    }
    return 0;
}

static int
LiveTable_clear(LiveTableObject *self)
{
    while (self->head.next != &self->head) {
        NodeObject *owned = live_unlink(NODE_OF(self->head.next));
        Py_XDECREF(owned);
    }
    return 0;
}

GC_DEALLOC(LiveTable, LiveTableObject)

static Py_ssize_t
LiveTable_len(LiveTableObject *self)
{
    return self->count;
}

static int
check_node(PyObject *op)
{
    if (!PyObject_TypeCheck(op, &NodeType)) {
        PyErr_SetString(PyExc_TypeError, "LiveTable holds exitsafe handle records only");
        return 0;
    }
    return 1;
}

static PyObject *
LiveTable_add(LiveTableObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(node, owned) takes two arguments");
        return NULL;
    }
    if (!check_node(args[0])) {
        return NULL;
    }
    int owned = PyObject_IsTrue(args[1]);
    if (owned < 0) {
        return NULL;
    }
    NodeObject *node = (NodeObject *)args[0];
    if (node->table != NULL) {
        PyErr_SetString(PyExc_ValueError, "the handle is already in a LiveTable");
        return NULL;
    }
    live_append(self, node, owned);
    Py_RETURN_NONE;
}

static PyObject *
LiveTable_discard(LiveTableObject *self, PyObject *arg)
{
    if (!check_node(arg)) {
        return NULL;
    }
    NodeObject *node = (NodeObject *)arg;
    if (node->table == self) {
        NodeObject *owned = live_unlink(node);
        Py_XDECREF(owned);
    }
    Py_RETURN_NONE;
}

/* nodes(): the handles and hooks, oldest first, as a new list.  The list is allocated
 * before the walk (an allocation may run a collection, which may unlink handles); the
 * walk itself allocates nothing. */
static PyObject *
LiveTable_nodes(LiveTableObject *self, PyObject *Py_UNUSED(ignored))
{
    for (;;) {
        Py_ssize_t count = self->count;
        PyObject *list = PyList_New(count);
        if (list == NULL) {
            return NULL;
        }
        LINK_LOCK();
        if (self->count != count) {
            LINK_UNLOCK();
            Py_DECREF(list);
            continue;
        }
        Py_ssize_t i = 0;
        for (LiveLink *l = self->head.next; l != &self->head; l = l->next) {
            PyObject *node = (PyObject *)NODE_OF(l);
#if defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030E0000
            /* Without the GIL, a handle held weakly may have lost its last reference on
             * another thread, whose dealloc waits for this mutex to unlink it: skip it
             * rather than revive it.  (3.13t has no public way to tell: a known hazard.) */
            if (!PyUnstable_TryIncRef(node)) {
                continue;
            }
#else
            Py_INCREF(node); /* with the GIL a dying handle is unlinked before we run */
#endif
            PyList_SET_ITEM(list, i++, node);
        }
        LINK_UNLOCK();
        Py_SET_SIZE(list, i); /* (fewer only where handles were being destroyed) */
        return list;
    }
}

/* since(seq): the handles and hooks whose creation number is above `seq`, oldest first.
 * The table is in creation order (a record is appended under exitsafe's lock when it
 * takes its number), so they are its tail: found without walking the rest (the graph's
 * index of dependents catches up with the handles created since its last look). */
static Py_ssize_t
live_count_since(LiveTableObject *self, Py_ssize_t seq)
{
    Py_ssize_t count = 0;
    for (LiveLink *l = self->head.prev; l != &self->head && NODE_OF(l)->seq > seq; l = l->prev) {
        count++;
    }
    return count;
}

static PyObject *
LiveTable_since(LiveTableObject *self, PyObject *arg)
{
    Py_ssize_t seq = PyLong_AsSsize_t(arg);
    if (seq == -1 && PyErr_Occurred()) {
        return NULL;
    }
    for (;;) {
        LINK_LOCK();
        Py_ssize_t count = live_count_since(self, seq);
        LINK_UNLOCK();
        PyObject *list = PyList_New(count); /* (may run a collection: counted again) */
        if (list == NULL) {
            return NULL;
        }
        LINK_LOCK();
        if (live_count_since(self, seq) != count) {
            LINK_UNLOCK();
            Py_DECREF(list);
            continue;
        }
        Py_ssize_t i = 0; /* newest first, then reversed */
        for (LiveLink *l = self->head.prev; l != &self->head && NODE_OF(l)->seq > seq;
             l = l->prev) {
            PyObject *node = (PyObject *)NODE_OF(l);
#if defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030E0000
            if (!PyUnstable_TryIncRef(node)) { /* being destroyed elsewhere: see nodes() */
                continue;
            }
#else
            Py_INCREF(node);
#endif
            PyList_SET_ITEM(list, i++, node);
        }
        LINK_UNLOCK();
        Py_SET_SIZE(list, i);
        if (PyList_Reverse(list) < 0) {
            Py_DECREF(list);
            return NULL;
        }
        return list;
    }
}

/* hold(node): nothing to do here: a record is linked in place until it ends or is
 * deallocated, and one whose collection began but which has not ended is still referenced
 * (by its release in progress, or resurrected by its finalizer), so it stays linked.  The
 * pure-Python table holds such a handle strongly (its weak reference may be cleared). */
static PyObject *
LiveTable_hold(LiveTableObject *self, PyObject *arg)
{
    if (!check_node(arg)) {
        return NULL;
    }
    /* linked: nothing to do to keep it; whether it is here (never registered: not) */
    return PyBool_FromLong(((NodeObject *)arg)->table == self);
}

static PyMethodDef LiveTable_methods[] = {
    {"hold", (PyCFunction)LiveTable_hold, METH_O,
     "hold(node)\n--\n\nKeep a handle whose collection began, until it ends (linked: nothing "
     "to do); whether it is in this table."},
    {"add", (PyCFunction)(void (*)(void))LiveTable_add, METH_FASTCALL,
     "add(node, owned)\n--\n\nAppend a handle (held weakly) or an owned hook (held strongly)."},
    {"discard", (PyCFunction)LiveTable_discard, METH_O,
     "discard(node)\n--\n\nRemove a handle or hook if present."},
    {"nodes", (PyCFunction)LiveTable_nodes, METH_NOARGS,
     "nodes()\n--\n\nThe handles and hooks not yet ended, oldest first."},
    {"since", (PyCFunction)LiveTable_since, METH_O,
     "since(seq)\n--\n\nThe handles and hooks created after creation number seq, oldest "
     "first."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods LiveTable_as_sequence = {
    .sq_length = (lenfunc)LiveTable_len,
};

static PyTypeObject LiveTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exitsafe._speedups.LiveTable",
    .tp_basicsize = sizeof(LiveTableObject),
    .tp_dealloc = (destructor)LiveTable_dealloc,
    .tp_as_sequence = &LiveTable_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A registry's handles not yet ended, oldest first (see exitsafe._live).",
    .tp_traverse = (traverseproc)LiveTable_traverse,
    .tp_clear = (inquiry)LiveTable_clear,
    .tp_methods = LiveTable_methods,
    .tp_new = LiveTable_new,
};

#define VISIT_EXTRA(field) Py_VISIT(x->field);
#define CLEAR_EXTRA(field) Py_CLEAR(x->field);

static int
Node_traverse(NodeObject *self, visitproc visit, void *arg)
{
    NODE_FIELDS(VISIT_FIELD)
    NodeExtra *x = self->extra;
    if (x != NULL) {
        NODE_EXTRA_FIELDS(VISIT_EXTRA)
    }
    return 0;
}

static int
Node_clear(NodeObject *self)
{
    /* first: clearing the fields below may run code that walks the table */
    Py_XDECREF((PyObject *)live_unlink(self));
    NODE_INT_FIELDS(CLEAR_FIELD)
    NODE_FIELDS(CLEAR_FIELD)
    NodeExtra *x = self->extra;
    if (x != NULL) {
        /* detached first: a field's destructor reading the handle sees None */
        self->extra = NULL;
        NODE_EXTRA_FIELDS(CLEAR_EXTRA)
        PyMem_Free(x);
    }
    return 0;
}

/* The getters and setters of the NodeExtra fields; `closure` is the field's offset. */
#if defined(__GNUC__) || defined(__clang__)
#define LOAD_ACQUIRE(p) __atomic_load_n(&(p), __ATOMIC_ACQUIRE)
#define STORE_RELEASE(p, v) __atomic_store_n(&(p), (v), __ATOMIC_RELEASE)
#else
#define LOAD_ACQUIRE(p) (p)
#define STORE_RELEASE(p, v) ((p) = (v))
#endif

/* Python reads and writes of these fields take the handle's critical section on
 * free-threaded builds (as member descriptors do), so that a first setter's allocation and
 * a value being replaced are never seen half done. */
#ifdef Py_GIL_DISABLED
#define EXTRA_BEGIN(self) Py_BEGIN_CRITICAL_SECTION((PyObject *)(self))
#define EXTRA_END() Py_END_CRITICAL_SECTION()
#else
#define EXTRA_BEGIN(self) {
#define EXTRA_END() }
#endif

static PyObject *
Node_get_extra(NodeObject *self, void *closure)
{
    PyObject *value = NULL;
    EXTRA_BEGIN(self);
    NodeExtra *x = LOAD_ACQUIRE(self->extra);
    if (x != NULL) {
        value = *(PyObject **)((char *)x + (size_t)closure);
    }
    if (value == NULL) {
        value = Py_None;
    }
    Py_INCREF(value);
    EXTRA_END();
    return value;
}

static int
Node_set_extra(NodeObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a handle's fields cannot be deleted");
        return -1;
    }
    PyObject *old = NULL;
    int rc = 0;
    EXTRA_BEGIN(self);
    NodeExtra *x = self->extra;
    if (x == NULL && value != Py_None) {
        x = PyMem_Calloc(1, sizeof(NodeExtra));
        if (x == NULL) {
            PyErr_NoMemory();
            rc = -1;
        }
        else {
            STORE_RELEASE(self->extra, x); /* published zeroed */
        }
    }
    if (x != NULL) {
        PyObject **slot = (PyObject **)((char *)x + (size_t)closure);
        Py_INCREF(value);
        old = *slot;
        STORE_RELEASE(*slot, value);
    }
    EXTRA_END();
    Py_XDECREF(old); /* outside the section: it may run code */
    return rc;
}

static inline PyObject *
extra_field(NodeObject *n, size_t offset) /* borrowed; never NULL */
{
    NodeExtra *x = LOAD_ACQUIRE(n->extra);
    PyObject *value = x ? LOAD_ACQUIRE(*(PyObject **)((char *)x + offset)) : NULL;
    return value ? value : Py_None;
}

#define EXTRA_GETSET(field)                                                                 \
    {"_" #field, (getter)Node_get_extra, (setter)Node_set_extra, NULL,                          \
     (void *)offsetof(NodeExtra, field)},

static PyGetSetDef Node_getset[] = {
    NODE_EXTRA_FIELDS(EXTRA_GETSET)
    {NULL, NULL, NULL, NULL, NULL},
};

static void
Node_dealloc(NodeObject *self)
{
    PyObject_GC_UnTrack(self);
    live_unlink(self); /* held weakly (an owned one is not being destroyed) */
    if (self->weaklist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    Node_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define NODE_MEMBER(field) {"_" #field, T_OBJECT_EX, offsetof(NodeObject, field), 0, NULL},

static PyMemberDef Node_members[] = {
    NODE_FIELDS(NODE_MEMBER)
    {"_rank", T_DOUBLE, offsetof(NodeObject, rank), 0, NULL},
    {"_seq", T_PYSSIZET, offsetof(NodeObject, seq), 0, NULL},
    {"_refs", T_OBJECT_EX, offsetof(NodeObject, refs), 0, NULL},
    {"_children", T_OBJECT_EX, offsetof(NodeObject, children), 0, NULL},
    {"_borrows", T_OBJECT_EX, offsetof(NodeObject, borrows), 0, NULL},
    {"_gen", T_INT, offsetof(NodeObject, gen), 0, NULL},
    {"_releaser", T_ULONG, offsetof(NodeObject, releaser), 0, NULL},
    {"_thread_id", T_ULONG, offsetof(NodeObject, thread_id), 0, NULL},
    {"_state", T_OBJECT_EX, offsetof(NodeObject, state), 0, NULL},
    {"_role", T_OBJECT_EX, offsetof(NodeObject, role), 0, NULL},
    {"_in_child", T_BOOL, offsetof(NodeObject, in_child), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

/* The last registry class seen (exitsafe.Registry, usually): a subclass test walks the
 * MRO, an identity test does not.  A strong reference, never dropped, so that the
 * pointer can never name another type. */
static PyTypeObject *known_registry_type;

static inline int is_registry(PyObject *op);

/* A registry whose fast-path fields have their usual types (a LiveTable, a list of
 * records): anything else, only private misuse can make, goes to the Python path. */
static inline int
is_fast_registry(PyObject *op)
{
    if (!is_registry(op)) {
        return 0;
    }
    RegistryObject *reg = (RegistryObject *)op;
    return reg->live != NULL && Py_TYPE(reg->live) == &LiveTableType && reg->records != NULL
           && PyList_CheckExact(reg->records);
}

static inline int
is_registry(PyObject *op)
{
    if (op == NULL) {
        return 0;
    }
    PyTypeObject *type = Py_TYPE(op);
    if (type == LOAD(known_registry_type)) {
        return 1;
    }
    if (!PyType_IsSubtype(type, &RegistryType)) {
        return 0;
    }
    Py_INCREF(type);
    STORE(known_registry_type, type); /* the previous one stays referenced: see above */
    return 1;
}

/* Whether a claimed node's release needs the pure-Python chain (`Registry._release_chain`):
 * it is tainted, thread-affine or inherited from a parent process. */
static inline int
needs_python(NodeObject *n)
{
    return (n->parents == NULL || !PyTuple_CheckExact(n->parents))
           || (n->extra != NULL
               && (extra_field(n, offsetof(NodeExtra, taint)) != Py_None
                   || extra_field(n, offsetof(NodeExtra, affinity)) != Py_None))
           || n->gen != generation;
}

/* ------------------------------------------------------------------ ReleasedRecord */

/* The ledger record of a released handle: the sequence (seq, kind, name, "released", None,
 * False), or (seq, kind, name, "released_at_exit", None, True) for one the exit teardown
 * released, that the ledger's other records hold as tuples, without the tuple's
 * garbage-collector tracking (it holds only ints and strs: nothing to visit, and the
 * collector need not count it). */
typedef struct {
    PyObject_HEAD
    Py_ssize_t seq; /* made an int when read: most records are never read */
    PyObject *kind, *name;
    char at_exit;
} RecordObject;

static Py_ssize_t
Record_len(PyObject *self)
{
    return 6;
}

static PyObject *
Record_item(PyObject *op, Py_ssize_t i)
{
    RecordObject *self = (RecordObject *)op;
    PyObject *value;
    switch (i) {
    case 0: return PyLong_FromSsize_t(self->seq);
    case 1: value = self->kind; break;
    case 2: value = self->name; break;
    case 3: value = self->at_exit ? released_at_exit_str : released_str; break;
    case 4: value = Py_None; break;
    case 5: value = self->at_exit ? Py_True : Py_False; break;
    default:
        PyErr_SetString(PyExc_IndexError, "record index out of range");
        return NULL;
    }
    return Py_NewRef(value);
}

static PyObject *
Record_tuple(PyObject *op)
{
    PyObject *items[6];
    for (Py_ssize_t i = 0; i < 6; i++) {
        items[i] = Record_item(op, i);
    }
    PyObject *t = NULL;
    if (items[0] != NULL) {
        t = PyTuple_Pack(6, items[0], items[1], items[2], items[3], items[4], items[5]);
    }
    for (Py_ssize_t i = 0; i < 6; i++) {
        Py_XDECREF(items[i]);
    }
    return t;
}

static PyObject *
Record_repr(PyObject *op)
{
    PyObject *t = Record_tuple(op);
    if (t == NULL) {
        return NULL;
    }
    PyObject *r = PyObject_Repr(t);
    Py_DECREF(t);
    return r;
}

static PyObject *
Record_richcompare(PyObject *a, PyObject *b, int op)
{
    /* compares as the tuple it stands for */
    PyObject *ta = Py_TYPE(a)->tp_repr == Record_repr ? Record_tuple(a) : (Py_INCREF(a), a);
    PyObject *tb = Py_TYPE(b)->tp_repr == Record_repr ? Record_tuple(b) : (Py_INCREF(b), b);
    PyObject *r = (ta && tb) ? PyObject_RichCompare(ta, tb, op) : NULL;
    Py_XDECREF(ta);
    Py_XDECREF(tb);
    return r;
}

static void
Record_dealloc(RecordObject *self)
{
    Py_XDECREF(self->kind);
    Py_XDECREF(self->name);
    PyObject_Free(self);
}

static PySequenceMethods Record_as_sequence = {
    .sq_length = Record_len,
    .sq_item = Record_item,
};

static PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exitsafe._speedups.ReleasedRecord",
    .tp_basicsize = sizeof(RecordObject),
    .tp_dealloc = (destructor)Record_dealloc,
    .tp_repr = Record_repr,
    .tp_as_sequence = &Record_as_sequence,
    .tp_richcompare = Record_richcompare,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A ledger record (seq, kind, name, 'released' or 'released_at_exit', None, "
              "at_exit), untracked.",
};

/* Add `length` to counts[outcome]. */
static int
add_count(PyObject *counts, PyObject *outcome, Py_ssize_t length)
{
    PyObject *old = PyDict_GetItemWithError(counts, outcome); /* borrowed */
    if (old == NULL && PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t before = old == NULL ? 0 : PyLong_AsSsize_t(old);
    if (before == -1 && PyErr_Occurred()) {
        return -1;
    }
    PyObject *value = PyLong_FromSsize_t(before + length);
    if (value == NULL) {
        return -1;
    }
    int rc = PyDict_SetItem(counts, outcome, value);
    Py_DECREF(value);
    return rc;
}

/* count_outcomes(records: list, stop: int, counts: dict) -> None
 *
 * exitsafe._ledger's count of the outcomes of records[:stop] into counts (Ledger.trim, on
 * the records it drops): a compiled record's outcome is read from its flag, a tuple's is its
 * item 3 (anything else is indexed), and a run of one outcome is added to the dict at once,
 * so that a trim costs a few instructions per record. */
static PyObject *
count_outcomes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "count_outcomes(records: list, stop, counts: dict)");
        return NULL;
    }
    PyObject *records = args[0], *counts = args[2];
    Py_ssize_t stop = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (stop == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *run = NULL; /* the outcome of the current run (a strong reference) */
    Py_ssize_t length = 0;
    for (Py_ssize_t i = 0; i < stop && i < PyList_GET_SIZE(records); i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        PyObject *outcome;
        if (Py_TYPE(record) == &RecordType && released_str != NULL) {
            outcome = ((RecordObject *)record)->at_exit ? released_at_exit_str : released_str;
            Py_INCREF(outcome);
        }
        else if (PyTuple_CheckExact(record) && PyTuple_GET_SIZE(record) > 3) {
            outcome = PyTuple_GET_ITEM(record, 3);
            Py_INCREF(outcome);
        }
        else {
            Py_INCREF(record); /* (indexing it may run code) */
            outcome = PySequence_GetItem(record, 3);
            Py_DECREF(record);
            if (outcome == NULL) {
                Py_XDECREF(run);
                return NULL;
            }
        }
        if (outcome == run) {
            Py_DECREF(outcome);
            length++;
            continue;
        }
        if (run != NULL && add_count(counts, run, length) < 0) {
            Py_DECREF(run);
            Py_DECREF(outcome);
            return NULL;
        }
        Py_XSETREF(run, outcome);
        length = 1;
    }
    if (run != NULL) {
        int rc = add_count(counts, run, length);
        Py_DECREF(run);
        if (rc < 0) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* Record `released` for n (claimed by this thread) in its registry; the caller holds the
 * lock.  Each parent loses a dependent; those left with no owner, dependent or borrow
 * while the registry is open are claimed and appended to `ready`.  Returns -1 with an
 * exception set on an internal failure (the section must still be left). */
/* Append n's record (`released`, or `released_at_exit` if at_exit) to reg's ledger; the
 * caller holds the lock.  Returns -1 with an exception set on a failure. */
static int
append_record(RegistryObject *reg, NodeObject *n, int at_exit)
{
    PyObject *name = extra_field(n, offsetof(NodeExtra, name));
    PyObject *kind = n->kind ? n->kind : Py_None;
    PyObject *record;
    if (!PyObject_IS_GC(kind) && !PyObject_IS_GC(name)) {
        /* only ints and strs: a record the collector never sees */
        RecordObject *r = PyObject_New(RecordObject, &RecordType);
        if (r == NULL) {
            return -1;
        }
        r->seq = n->seq;
        r->kind = Py_NewRef(kind);
        r->name = Py_NewRef(name);
        r->at_exit = (char)at_exit;
        record = (PyObject *)r;
    }
    else {
        PyObject *seq = PyLong_FromSsize_t(n->seq);
        record = seq ? PyTuple_Pack(6, seq, kind, name,
                                    at_exit ? released_at_exit_str : released_str, Py_None,
                                    at_exit ? Py_True : Py_False)
                     : NULL;
        Py_XDECREF(seq);
        if (record == NULL) {
            return -1;
        }
    }
    int rc = PyList_Append(reg->records, record);
    Py_DECREF(record); /* the list holds it: no user code runs */
    if (rc < 0) {
        return -1;
    }
    if (PyList_GET_SIZE(reg->records) > reg->cap) {
        /* ledger.trim(): exitsafe's own bookkeeping, run in the section as the pure-Python
         * path does. */
        PyObject *ledger = PyObject_GetAttr((PyObject *)reg, str_ledger);
        PyObject *t = ledger ? PyObject_CallMethodNoArgs(ledger, str_trim) : NULL;
        Py_XDECREF(ledger);
        if (t == NULL) {
            return -1;
        }
        Py_DECREF(t);
    }
    return 0;
}

static int
record_released(RegistryObject *reg, NodeObject *n, unsigned long me, PyObject *ready,
                NodeObject **owned)
{
    iset(&n->state, RELEASED);
    n->releaser = 0;
    *owned = live_unlink(n); /* (a handle: held weakly, nothing to drop) */
    if (append_record(reg, n, 0) < 0) {
        return -1;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(n->parents);
    for (Py_ssize_t i = 0; i < count; i++) {
        NodeObject *parent = (NodeObject *)PyTuple_GET_ITEM(n->parents, i);
        long children = ival(parent->children) - 1;
        iset_counter(&parent->children, children);
        if (parent->children == NULL) {
            return -1;
        }
        if (reg->phase == PHASE_OPEN && ival(parent->state) == LIVE && children == 0
            && ival(parent->refs) == 0 && ival(parent->borrows) == 0) {
            iset(&parent->state, RELEASING);
            parent->releaser = me;
            if (PyList_Append(ready, (PyObject *)parent) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* `release_one` of a node the Python release chain must release (see needs_python):
 * its error kept in *error if it is the first (an interrupt replaces any).  Returns -1
 * on an internal failure. */
static int
release_in_python(NodeObject *n, PyObject **error)
{
    PyObject *interrupt = NULL, *arg = (PyObject *)n;
    PyObject *r = call_until_done(release_chain_py, &arg, 1, &interrupt);
    if (r == NULL) {
        Py_XDECREF(interrupt);
        return -1;
    }
    if (interrupt != NULL) { /* (raised rather than a release function's error) */
        Py_DECREF(r);
        Py_XSETREF(*error, interrupt);
    }
    else if (r != Py_None && *error == NULL) {
        *error = r;
    }
    else {
        Py_DECREF(r);
    }
    return 0;
}

/* `release_one` after the release function of `n` raised (the exception set): recorded by
 * the Python `_release_failed`, which also goes on with what it frees; the exception kept
 * in *error if it is the first (an interrupt while recording replaces any).  Returns -1
 * on an internal failure. */
static int
release_fn_failed(NodeObject *n, PyObject **error)
{
    PyObject *exc = take_exception();
    /* the parents it frees are claimed into `freed`, kept across the tries */
    PyObject *freed = PyList_New(0);
    PyObject *interrupt = NULL;
    PyObject *fargs[3] = {(PyObject *)n, exc, freed};
    PyObject *done = freed ? call_until_done(release_failed_py, fargs, 3, &interrupt) : NULL;
    Py_XDECREF(freed);
    if (done == NULL) {
        Py_DECREF(exc);
        Py_XDECREF(interrupt);
        return -1;
    }
    if (interrupt != NULL) {
        Py_DECREF(done);
        done = interrupt;
    }
    if (done != Py_None) { /* an interrupt while recording it: raised, not an error */
        Py_XSETREF(*error, done);
        Py_DECREF(exc);
        return 0;
    }
    Py_DECREF(done);
    if (*error == NULL) {
        *error = exc;
    }
    else {
        Py_DECREF(exc);
    }
    return 0;
}

/* Release one claimed node: its release function outside the lock, then its record.
 * Parents it frees are appended to `ready` (claimed).  A failure of the release function
 * is recorded by the Python `_release_failed` (which also goes on with what it frees)
 * and kept in *error if it is the first.  Returns -1 on an internal failure. */
static int
release_one(RegistryObject *reg, NodeObject *n, unsigned long me, PyObject **ready,
            PyObject **error)
{
    if (needs_python(n)) {
        return release_in_python(n, error);
    }
    PyObject *fn = n->fn, *raw = n->raw;
    if (fn == NULL || raw == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "exitsafe: a claimed handle has no release function");
        return -1;
    }
    Py_INCREF(fn);
    Py_INCREF(raw);
    PyObject *r = PyObject_CallOneArg(fn, raw);
    Py_DECREF(fn);
    Py_DECREF(raw);
    if (r == NULL) {
        return release_fn_failed(n, error);
    }
    Py_DECREF(r);
    if (*ready == NULL && PyTuple_GET_SIZE(n->parents)) {
        *ready = PyList_New(0); /* made before the section: it is a GC allocation */
        if (*ready == NULL) {
            return -1;
        }
    }
    PyObject *interrupt = NULL; /* (raised by the caller, as a release function's error) */
    if (enter_section_to_record(me, &interrupt) < 0) {
        return -1;
    }
    if (interrupt != NULL) { /* (raised rather than an earlier release's error) */
        Py_XSETREF(*error, interrupt);
    }
    int failed = 0;
    PyObject *parents = NULL;
    NodeObject *owned = NULL;
    if (ival(n->state) == RELEASING) { /* else a teardown gave up waiting and recorded it */
        failed = record_released(reg, n, me, *ready, &owned) < 0;
        if (!failed) {
            parents = n->parents; /* dropped after the section */
            n->parents = PyTuple_New(0);
        }
    }
    lock_drop(the_lock);
    /* Outside the lock: dropping these may run the object's __del__. */
    PyObject *old_raw = n->raw, *old_fn = n->fn;
    n->raw = Py_NewRef(Py_None);
    n->fn = Py_NewRef(Py_None);
    Py_XDECREF(old_raw);
    Py_XDECREF(old_fn);
    Py_XDECREF(parents);
    Py_XDECREF((PyObject *)owned);
    return failed ? -1 : 0;
}

/* Release `first` (claimed by this thread) and every parent it frees, iteratively, as
 * `Registry._release_chain` does.  Returns 0 with *error the first exception a release
 * function raised (recorded) or NULL; -1 with an exception set on an internal failure. */
static int
release_claimed(RegistryObject *reg, NodeObject *first, unsigned long me, PyObject **error)
{
    *error = NULL;
    PyObject *ready = NULL; /* the parents freed and claimed, made when needed */
    Py_INCREF(first);
    NodeObject *n = first;
    int rc = 0;
    for (;;) {
        rc = release_one(reg, n, me, &ready, error);
        Py_DECREF(n);
        Py_ssize_t left = ready == NULL ? 0 : PyList_GET_SIZE(ready);
        if (rc < 0 || left == 0) {
            break;
        }
        n = (NodeObject *)PyList_GET_ITEM(ready, left - 1);
        Py_INCREF(n);
        if (PyList_SetSlice(ready, left - 1, left, NULL) < 0) {
            Py_DECREF(n);
            rc = -1;
            break;
        }
    }
    Py_XDECREF(ready);
    if (rc < 0) {
        Py_CLEAR(*error);
    }
    return rc;
}

/* The entry of the compiled paths of a handle: its registry has the usual fields, is open,
 * this thread is not inside a section (a finalizer that interrupted one) and took the lock
 * at once.  Returns the registry, the lock held; or NULL (nothing taken): the Python path.
 * The phase is read again under the lock. */
static inline RegistryObject *
enter_fast(NodeObject *n, unsigned long me)
{
    PyObject *regobj = n->registry;
    if (!is_fast_registry(regobj) || LOAD(((RegistryObject *)regobj)->phase) != PHASE_OPEN
        || LOAD(the_lock->owner) == me || !lock_try(the_lock, me)) {
        return NULL;
    }
    RegistryObject *reg = (RegistryObject *)regobj;
    if (reg->phase != PHASE_OPEN) {
        lock_drop(the_lock);
        return NULL;
    }
    return reg;
}

static PyObject *
Node_release_fast(NodeObject *self, PyObject *Py_UNUSED(ignored))
{
    unsigned long me = PyThread_get_thread_ident();
    RegistryObject *reg = enter_fast(self, me);
    if (reg == NULL) {
        goto slow;
    }
    long refs = ival(self->refs);
    if (ival(self->state) != LIVE || refs <= 0
        || (refs == 1 && ival(self->children) && reg->strict != NULL
            && reg->strict != Py_False)) {
        lock_drop(the_lock);
        goto slow;
    }
    iset_counter(&self->refs, --refs);
    if (refs || ival(self->children) || ival(self->borrows)) {
        lock_drop(the_lock);
        if (after_call(1) < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    iset(&self->state, RELEASING);
    self->releaser = me;
    lock_drop(the_lock);
    Py_INCREF(reg);
    PyObject *error = NULL;
    if (release_claimed(reg, self, me, &error) < 0) {
        Py_DECREF(reg);
        return NULL;
    }
    Py_DECREF(reg);
    /* as the Python path: queued thread-affine releases run only when nothing is raised */
    if (after_call(error == NULL) < 0) {
        Py_XDECREF(error);
        return NULL;
    }
    if (error != NULL) {
        raise_exception(error);
        return NULL;
    }
    Py_RETURN_NONE;
slow:
    return PyObject_CallOneArg(drop_owner_py, (PyObject *)self);
}

static PyObject *
Node_retain_fast(NodeObject *self, PyObject *Py_UNUSED(ignored))
{
    unsigned long me = PyThread_get_thread_ident();
    if (enter_fast(self, me) == NULL) {
        goto slow;
    }
    long refs = ival(self->refs);
    if (ival(self->state) != LIVE || refs <= 0) {
        lock_drop(the_lock);
        goto slow;
    }
    iset_counter(&self->refs, refs + 1);
    if (self->refs == NULL) {
        lock_drop(the_lock);
        return NULL;
    }
    lock_drop(the_lock);
    if (after_call(0) < 0) {
        return NULL;
    }
    return Py_NewRef(self);
slow: {
        PyObject *r = PyObject_CallOneArg(retain_py, (PyObject *)self);
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
        return Py_NewRef(self);
    }
}

/* The garbage collection of a handle that still has owners (Handle.__del__). */
static int
node_collected(NodeObject *n)
{
    PyObject *regobj = n->registry;
    unsigned long me = PyThread_get_thread_ident();
    RegistryObject *reg = enter_fast(n, me);
    if (reg == NULL) { /* the Python path: Registry._collected */
        PyObject *r = PyObject_CallOneArg(collected_py, (PyObject *)n);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
        return 0;
    }
    int claimed = 0;
    if (ival(n->state) == LIVE && ival(n->refs)) {
        iset(&n->refs, 0);
        if (!(ival(n->children) || ival(n->borrows))) {
            iset(&n->state, RELEASING);
            n->releaser = me;
            claimed = 1;
        }
    }
    lock_drop(the_lock);
    if (claimed) {
        Py_INCREF(regobj);
        PyObject *error = NULL;
        int rc = release_claimed(reg, n, me, &error);
        if (error != NULL) {
            PyObject *r = call2(collected_failed_py, (PyObject *)n, error);
            Py_DECREF(error);
            if (r == NULL) {
                rc = -1;
            }
            Py_XDECREF(r);
        }
        Py_DECREF(regobj);
        if (rc < 0) {
            return -1;
        }
    }
    return after_call(0);
}

static void
Node_finalize(PyObject *self)
{
    NodeObject *n = (NodeObject *)self;
    /* no owner; not in its registry's live table (never registered: track() was
     * interrupted, and its caller still owns the object); or the core not set up */
    if (n->refs == NULL || ival(n->refs) == 0 || n->table == NULL || n->registry == NULL
        || the_lock == NULL) {
        return;
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *saved = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
#endif
    if (node_collected(n) < 0) {
        PyErr_WriteUnraisable(self);
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(saved);
#else
    PyErr_Restore(type, value, tb);
#endif
}

static PyMethodDef Node_methods[] = {
    {"release", (PyCFunction)Node_release_fast, METH_NOARGS,
     "release($self, /)\n--\n\n"
     "Remove one owner; release natively when none is left and no dependent lives.\n\n"
     "The compiled Handle.release (see exitsafe.Handle.release)."},
    {"retain", (PyCFunction)Node_retain_fast, METH_NOARGS,
     "retain($self, /)\n--\n\n"
     "Add one owner and return this handle (see exitsafe.Handle.retain)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject NodeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exitsafe._speedups.Node",
    .tp_basicsize = sizeof(NodeObject),
    .tp_dealloc = (destructor)Node_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The compiled handle record (the base of exitsafe._node.Node).",
    .tp_traverse = (traverseproc)Node_traverse,
    .tp_clear = (inquiry)Node_clear,
    .tp_weaklistoffset = offsetof(NodeObject, weaklist),
    .tp_methods = Node_methods,
    .tp_members = Node_members,
    .tp_getset = Node_getset,
    .tp_finalize = Node_finalize,
};

/* ------------------------------------------------------------------ Registry.track */

static int
kw_is(PyObject *key, PyObject *name)
{
    return key == name || PyUnicode_Compare(key, name) == 0;
}

/* The keyword arguments of a track (`kwvalues`, named by `kwnames`) that a compiled path
 * handles: `kind` and `depends_on` (stored in *kind and *deps); with `regarg` (an adapter's
 * track), `registry` (stored in *regarg) and `lib` left None; and `name`, `exit_policy`,
 * `timeout`, `affinity` left None.  Whether the call can take the compiled path. */
static inline int
fast_kwargs(PyObject *const *kwvalues, PyObject *kwnames, PyObject **kind, PyObject **deps,
            PyObject **regarg)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i);
        PyObject *value = kwvalues[i];
        if (kw_is(key, kw_kind)) {
            *kind = value;
        }
        else if (kw_is(key, kw_depends_on)) {
            *deps = value;
        }
        else if (regarg != NULL && kw_is(key, kw_registry)) {
            *regarg = value;
        }
        else if (value != Py_None
                 || !((regarg != NULL && kw_is(key, kw_lib)) || kw_is(key, kw_name)
                      || kw_is(key, kw_exit_policy) || kw_is(key, kw_timeout)
                      || kw_is(key, kw_affinity))) {
            return 0;
        }
    }
    return 1;
}

/* The pure-Python Registry.track, called as track_py(facade, *args, **kwargs). */
static PyObject *
call_track_py(PyObject *facade, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *stackbuf[8];
    PyObject **stack = stackbuf;
    Py_ssize_t total = 1 + nargs + nkw;
    if (total > 8) {
        stack = PyMem_Malloc(total * sizeof(PyObject *));
        if (stack == NULL) {
            return PyErr_NoMemory();
        }
    }
    stack[0] = facade;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) {
        stack[i + 1] = args[i];
    }
    PyObject *fn = track_py;
    PyObject *r;
    if (fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "exitsafe._speedups.setup() was not called");
        r = NULL;
    }
    else {
        r = PyObject_Vectorcall(fn, stack, 1 + nargs, kwnames);
    }
    if (stack != stackbuf) {
        PyMem_Free(stack);
    }
    return r;
}

/* The parents of a compiled track, from its depends_on (`deps`; NULL: not given): a
 * handle, or a tuple or list of up to 8 distinct handles, of `self` and not hooks.
 * Returns 1 with *out a new tuple of them; 0 for anything else (duplicates, objects to
 * resolve, other iterables...), which the Python path checks and explains; -1 on an
 * error. */
static int
track_parents(RegistryObject *self, PyObject *deps, PyObject **out)
{
    PyObject *parents;
    if (deps == NULL || ((PyTuple_CheckExact(deps) || PyList_CheckExact(deps))
                         && Py_SIZE(deps) == 0)) {
        parents = PyTuple_New(0);
    }
    else if (PyObject_TypeCheck(deps, handle_type)) {
        parents = PyTuple_Pack(1, deps);
    }
    else if ((PyTuple_CheckExact(deps) || PyList_CheckExact(deps)) && Py_SIZE(deps) <= 8) {
        parents = PyTuple_CheckExact(deps) ? (Py_INCREF(deps), deps) : PyList_AsTuple(deps);
        if (parents == NULL) {
            return -1;
        }
        Py_ssize_t count = PyTuple_GET_SIZE(parents);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *item = PyTuple_GET_ITEM(parents, i);
            int distinct = PyObject_TypeCheck(item, handle_type);
            for (Py_ssize_t j = 0; j < i && distinct; j++) {
                distinct = PyTuple_GET_ITEM(parents, j) != item;
            }
            if (!distinct) {
                Py_DECREF(parents);
                return 0;
            }
        }
    }
    else {
        return 0;
    }
    if (parents == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(parents); i++) {
        NodeObject *parent = (NodeObject *)PyTuple_GET_ITEM(parents, i);
        if (parent->registry != (PyObject *)self || ival(parent->role) == HOOK_ROLE) {
            Py_DECREF(parents);
            return 0;
        }
    }
    *out = parents;
    return 1;
}

/* A new node for a compiled track, not registered yet, holding one owner; it takes the
 * reference to `parents` (released when NULL is returned). */
static NodeObject *
new_tracked_node(RegistryObject *self, PyObject *raw, PyObject *release, PyObject *kind,
                 PyObject *parents, unsigned long me)
{
    NodeObject *node = (NodeObject *)handle_type->tp_alloc(handle_type, 0);
    if (node == NULL) {
        Py_DECREF(parents);
        return NULL;
    }
    node->registry = Py_NewRef(self);
    node->raw = Py_NewRef(raw);
    node->fn = Py_NewRef(release);
    node->kind = Py_NewRef(kind);
    node->parents = parents; /* name, policy, timeout, taint, affinity: None (no extra) */
    iset(&node->role, (kind != str_handle && PyUnicode_GET_LENGTH(kind) == 7
                       && PyUnicode_Compare(kind, str_library) == 0)
                          ? LIBRARY_ROLE
                          : HANDLE_ROLE);
    iset(&node->refs, 1);
    iset(&node->state, LIVE);
    iset(&node->children, 0);
    iset(&node->borrows, 0);
    node->gen = (int)generation;
    node->thread_id = me;
    return node;
}

/* Drop a node that was never registered (refused, or interrupted before): its finalizer
 * must not release what the caller still owns. */
static void
drop_unregistered(NodeObject *node)
{
    iset(&node->refs, 0);
    iset(&node->state, 3);
    Py_DECREF(node);
}

/* The end of a compiled track that found its registry closed once in its section (the
 * lock already dropped): recorded as the Python path does; the node, or NULL. */
static PyObject *
track_after_close(RegistryObject *self, NodeObject *node, int leaf)
{
    PyObject *r = call2(registered_after_close_py, (PyObject *)self, (PyObject *)node);
    if (r == NULL) {
        Py_DECREF(node);
        return NULL;
    }
    Py_DECREF(r);
    if (after_call(leaf) < 0) { /* the Python path's: see state_track */
        Py_DECREF(node);
        return NULL;
    }
    return (PyObject *)node;
}

/* Queued work run after a registration raised: track() raises it, and its caller, who
 * never gets the handle, still owns the object (Registry._undo_track detaches the node).
 * Returns NULL with that error set. */
static PyObject *
track_undone(NodeObject *node)
{
    PyObject *exc = take_exception();
    PyObject *again = NULL, *arg = (PyObject *)node;
    PyObject *r = call_until_done(undo_track_py, &arg, 1, &again);
    if (r == NULL) { /* (a second error: reported, the first one is raised) */
        PyErr_WriteUnraisable((PyObject *)node);
    }
    Py_XDECREF(r);
    Py_XDECREF(again); /* (the error in flight is raised) */
    Py_DECREF(node);
    raise_exception(exc);
    return NULL;
}

/* The compiled Registry.track: `self` is the registry's state, `facade` the public
 * Registry it is the state of (the Python path is called as Registry.track(facade, ...)). */
static PyObject *
state_track(RegistryObject *self, PyObject *facade, PyObject *const *args, Py_ssize_t nargsf,
            PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *kind = str_handle, *deps = NULL, *parents = NULL;
    if (nargs != 2 || !ready() || !fast_kwargs(args + nargs, kwnames, &kind, &deps, NULL)) {
        goto slow;
    }
    PyObject *raw = args[0], *release = args[1];
    unsigned long me = PyThread_get_thread_ident();
    if (!PyUnicode_CheckExact(kind) || !PyCallable_Check(release)
        || LOAD(self->phase) != PHASE_OPEN || LOAD(the_lock->owner) == me
        || self->live == NULL || Py_TYPE(self->live) != &LiveTableType
        || self->records == NULL || !PyList_CheckExact(self->records)) {
        goto slow;
    }
    int found = track_parents(self, deps, &parents);
    if (found <= 0) {
        if (found < 0) {
            return NULL;
        }
        goto slow;
    }
    Py_ssize_t nparents = PyTuple_GET_SIZE(parents);
    NodeObject *node = new_tracked_node(self, raw, release, kind, parents, me);
    if (node == NULL) {
        return NULL;
    }
    if (enter_section(me) < 0) { /* interrupted while waiting (a KeyboardInterrupt) */
        drop_unregistered(node);
        return NULL;
    }
    if (self->phase != PHASE_OPEN) { /* closed meanwhile */
        lock_drop(the_lock);
        return track_after_close(self, node, nparents == 0);
    }
    for (Py_ssize_t i = 0; i < nparents; i++) {
        NodeObject *parent = (NodeObject *)PyTuple_GET_ITEM(parents, i);
        if (ival(parent->state) != LIVE || ival(parent->refs) <= 0) {
            /* no longer usable: the Python path explains it (HandleClosedError) */
            lock_drop(the_lock);
            drop_unregistered(node);
            goto slow;
        }
    }
    int failed = 0;
    for (Py_ssize_t i = 0; i < nparents && !failed; i++) {
        NodeObject *parent = (NodeObject *)PyTuple_GET_ITEM(parents, i);
        iset_counter(&parent->children, ival(parent->children) + 1);
        failed = parent->children == NULL;
    }
    if (!failed) {
        node->seq = ++self->seq;
        node->rank = (double)node->seq;
        live_append((LiveTableObject *)self->live, node, 0);
    }
    lock_drop(the_lock);
    if (failed) {
        drop_unregistered(node);
        return NULL;
    }
    /* as the Python path: this thread's queued affine releases run after a handle with no
     * parents only (the registration of one with parents runs only the deferred work) */
    if (after_call(nparents == 0) < 0) {
        return track_undone(node);
    }
    return (PyObject *)node;

slow:
    return call_track_py(facade, args, nargs, kwnames);
}

/* ------------------------------------------------------------------ RegistryBase */

/* The base of the public exitsafe.Registry: a facade holding the registry's state. */
typedef struct {
    PyObject_HEAD
    PyObject *state; /* _state: the registry's state (a RegistryCore), set by __init__ */
} FacadeObject;

static PyTypeObject FacadeType;

#define FACADE_FIELDS(X) X(state)
GC_SLOTS(Facade, FacadeObject, FACADE_FIELDS)

static PyMemberDef Facade_members[] = {
    {"_state", T_OBJECT_EX, offsetof(FacadeObject, state), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *
Facade_track(FacadeObject *self, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames)
{
    PyObject *state = self->state;
    if (state == NULL || !is_registry(state)) {
        return call_track_py((PyObject *)self, args, PyVectorcall_NARGS(nargsf), kwnames);
    }
    return state_track((RegistryObject *)state, (PyObject *)self, args, nargsf, kwnames);
}

static PyMethodDef Facade_methods[] = {
    {"track", (PyCFunction)(void (*)(void))Facade_track, METH_FASTCALL | METH_KEYWORDS,
     "track($self, raw, release, kind='handle', depends_on=(), exit_policy=None, "
     "name=None, timeout=None, affinity=None)\n--\n\n"
     "Start owning `raw`: `release(raw)` is called exactly once, or never if leaked.\n\n"
     "The compiled Registry.track (see exitsafe.Registry.track)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FacadeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exitsafe._speedups.RegistryBase",
    .tp_basicsize = sizeof(FacadeObject),
    .tp_dealloc = (destructor)Facade_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The compiled base of exitsafe.Registry: a facade holding its state.",
    .tp_traverse = (traverseproc)Facade_traverse,
    .tp_clear = (inquiry)Facade_clear,
    .tp_methods = Facade_methods,
    .tp_members = Facade_members,
};

/* exitsafe.track(raw, release, **options): the default registry's track. */
static PyObject *default_list;    /* exitsafe._process._default: [] or [the registry] */
static PyObject *default_registry_py; /* exitsafe._process.default_registry */

/* The default registry (a new reference), created on first use; NULL with an exception. */
static PyObject *
default_registry_ref(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *reg = PyList_GetItemRef(default_list, 0); /* (safe against a concurrent store) */
    if (reg != NULL) {
        return reg;
    }
    PyErr_Clear(); /* an IndexError: not created yet */
#else
    if (PyList_GET_SIZE(default_list)) {
        PyObject *reg = PyList_GET_ITEM(default_list, 0);
        return Py_NewRef(reg);
    }
#endif
    return PyObject_CallNoArgs(default_registry_py);
}

static PyObject *
module_track(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames)
{
    if (!ready()) {
        return NULL;
    }
    PyObject *reg = default_registry_ref();
    if (reg == NULL) {
        return NULL;
    }
    PyObject *r;
    if (PyObject_TypeCheck(reg, &FacadeType)) {
        r = Facade_track((FacadeObject *)reg, args, nargsf, kwnames);
    }
    else {
        PyErr_SetString(PyExc_TypeError, "exitsafe: the default registry is not a Registry");
        r = NULL;
    }
    Py_DECREF(reg);
    return r;
}

/* ------------------------------------------------------------------ pointers (adapters) */

/* The adapters' address table (exitsafe._adapter.addresses, a ClaimTable): its dict
 * (address -> a weak reference to the handle, or the reservation marker RESERVED: one
 * object per entry), the marker, and its Python `forget`, which the compiled release calls whenever it cannot take the
 * lock at once.  Set by setup_pointers(). */
static PyObject *ptr_entries, *ptr_reserved, *ptr_forget_py;
static PyObject *kind_names; /* ("kind",): the keyword names of a track(raw, fn, kind=...) */

/* A strong reference to what `ref` (a weak reference) refers to, or NULL (dead, or not a
 * weak reference); never sets an exception. */
static PyObject *
weak_target(PyObject *ref)
{
    if (!PyWeakref_Check(ref)) {
        return NULL;
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *obj = NULL;
    if (PyWeakref_GetRef(ref, &obj) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return obj;
#else
    PyObject *obj = PyWeakref_GetObject(ref);
    if (obj == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (obj == Py_None) {
        return NULL;
    }
    return Py_NewRef(obj);
#endif
}

/* The release function of a tracked pointer (exitsafe._pointers.PointerRelease): forget
 * the address, then call `release(raw)`. */
typedef struct {
    PyObject_HEAD
    PyObject *release, *address, *keep, *handle;
    vectorcallfunc vectorcall; /* called as release(raw) without an argument tuple */
} PointerReleaseObject;

static PyObject *PointerRelease_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf,
                                           PyObject *kwnames);

static PyTypeObject PointerReleaseType;

static PyObject *
pointer_release_alloc(PyTypeObject *type, PyObject *release, PyObject *address, PyObject *keep)
{
    PointerReleaseObject *self = (PointerReleaseObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->release = Py_NewRef(release);
    self->address = Py_NewRef(address);
    self->keep = Py_NewRef(keep);
    self->handle = Py_NewRef(Py_None);
    self->vectorcall = PointerRelease_vectorcall;
    return (PyObject *)self;
}

static PyObject *
pointer_release_new(PyObject *release, PyObject *address, PyObject *keep)
{
    return pointer_release_alloc(&PointerReleaseType, release, address, keep);
}

static PyObject *
PointerRelease_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *release, *address, *keep;
    static char *names[] = {"release", "address", "keep", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:PointerRelease", names, &release,
                                     &address, &keep)) {
        return NULL;
    }
    return pointer_release_alloc(type, release, address, keep);
}

#define POINTER_RELEASE_FIELDS(X) X(release) X(address) X(keep) X(handle)
GC_SLOTS(PointerRelease, PointerReleaseObject, POINTER_RELEASE_FIELDS)

/* addresses.forget(address, handle): drop the entry if `handle` (or a dead handle) still
 * owns it.  In a section of its own when the lock is free; otherwise (held by another
 * thread, or by this one: a finalizer inside a section) the Python method decides. */
static int
pointer_forget(PointerReleaseObject *self)
{
    if (ptr_entries == NULL || self->address == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "exitsafe._speedups.setup_pointers() was not called");
        return -1;
    }
    PyObject *handle = self->handle ? weak_target(self->handle) : NULL;
    unsigned long me = PyThread_get_thread_ident();
    if (LOAD(the_lock->owner) == me || !lock_try(the_lock, me)) {
        PyObject *r = call2(ptr_forget_py, self->address, handle ? handle : Py_None);
        Py_XDECREF(handle);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
        return 0;
    }
    /* in the section: no user code runs (nothing below calls any; what is dropped is
     * dropped after it) */
    PyObject *entry = PyDict_GetItemWithError(ptr_entries, self->address);
    PyObject *current = NULL, *dropped = NULL;
    int rc = 0;
    if (entry == NULL) {
        rc = PyErr_Occurred() ? -1 : 0;
    }
    else if (entry != ptr_reserved && PyWeakref_Check(entry)) {
        current = weak_target(entry);
        if (current == NULL || current == handle) {
            dropped = Py_NewRef(entry);
            rc = PyDict_DelItem(ptr_entries, self->address);
        }
    }
    lock_drop(the_lock);
    Py_XDECREF(dropped);
    Py_XDECREF(current);
    Py_XDECREF(handle);
    if (rc < 0) {
        return -1;
    }
    return after_call(0);
}

static PyObject *
PointerRelease_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PointerReleaseObject *self = (PointerReleaseObject *)op;
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "a pointer's release takes one positional argument");
        return NULL;
    }
    PyObject *raw = args[0];
    if (pointer_forget(self) < 0) {
        return NULL;
    }
    PyObject *release = self->release;
    if (release == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this pointer's release was cleared");
        return NULL;
    }
    Py_INCREF(release);
    PyObject *r = PyObject_CallOneArg(release, raw);
    Py_DECREF(release);
    return r;
}

static PyMemberDef PointerRelease_members[] = {
    {"release", T_OBJECT, offsetof(PointerReleaseObject, release), READONLY, NULL},
    {"address", T_OBJECT, offsetof(PointerReleaseObject, address), READONLY, NULL},
    {"keep", T_OBJECT, offsetof(PointerReleaseObject, keep), READONLY, NULL},
    {"handle", T_OBJECT, offsetof(PointerReleaseObject, handle), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PointerReleaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exitsafe._speedups.PointerRelease",
    .tp_basicsize = sizeof(PointerReleaseObject),
    .tp_dealloc = (destructor)PointerRelease_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(PointerReleaseObject, vectorcall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "PointerRelease(release, address, keep)\n--\n\n"
              "The release function of a tracked pointer: forget its address in the "
              "adapters' table, then call release(raw) (see exitsafe._adapter).",
    .tp_traverse = (traverseproc)PointerRelease_traverse,
    .tp_clear = (inquiry)PointerRelease_clear,
    .tp_members = PointerRelease_members,
    .tp_new = PointerRelease_new,
};

/* Drop the reservation of `address` (its registration failed). */
static int
pointer_cancel(PyObject *address)
{
    unsigned long me = PyThread_get_thread_ident();
    if (enter_section(me) < 0) {
        return -1;
    }
    PyObject *entry = PyDict_GetItemWithError(ptr_entries, address);
    int rc = entry == NULL ? (PyErr_Occurred() ? -1 : 0) : 0;
    PyObject *dropped = NULL;
    if (entry != NULL && entry == ptr_reserved) {
        dropped = Py_NewRef(entry);
        rc = PyDict_DelItem(ptr_entries, address);
    }
    lock_drop(the_lock);
    Py_XDECREF(dropped);
    return rc;
}

/* Own `address` for a new handle: track `raw` in `reg` with a PointerRelease (depending on
 * the handles of the tuple `deps`, or on nothing if NULL), claiming the address first (the
 * caller checked it is free only under the lock, here).  Returns the handle, or NULL with
 * an exception, or NULL without one when the address is taken (the Python path then
 * explains it: AlreadyTrackedError, or a dead owner replaced). */
static PyObject *kind_deps_names; /* ("kind", "depends_on") */

static PyObject *
pointer_track(RegistryObject *reg, PyObject *facade, PyObject *raw, PyObject *release,
              PyObject *address, PyObject *keep, PyObject *kind, PyObject *deps)
{
    unsigned long me = PyThread_get_thread_ident();
    if (enter_section(me) < 0) {
        return NULL;
    }
    PyObject *entry = PyDict_GetItemWithError(ptr_entries, address);
    int rc = -1;
    if (entry == NULL && !PyErr_Occurred()) {
        rc = PyDict_SetItem(ptr_entries, address, ptr_reserved);
    }
    lock_drop(the_lock);
    if (rc < 0) {
        return NULL; /* taken (no exception) or an error */
    }
    PyObject *releaser = pointer_release_new(release, address, keep);
    PyObject *handle = NULL;
    if (releaser != NULL) {
        PyObject *targs[4] = {raw, releaser, kind, deps};
        handle = state_track(reg, facade, targs, 2, deps != NULL ? kind_deps_names : kind_names);
    }
    if (handle == NULL) {
        /* as the Python path: cancel the claim, then raise what the registration raised */
        PyObject *exc = take_exception();
        Py_XDECREF(releaser);
        if (pointer_cancel(address) < 0) {
            Py_XDECREF(exc);
            return NULL;
        }
        raise_exception(exc);
        return NULL;
    }
    /* bind (no lock, as ClaimTable.bind: one dict store): a live handle owns the address */
    int bound = -1;
    if (PyObject_TypeCheck(handle, &NodeType)
        && ival(((NodeObject *)handle)->state) == LIVE) {
        /* the entry is the handle's weak reference itself (see ClaimTable) */
        PyObject *ref = PyWeakref_NewRef(handle, NULL);
        if (ref != NULL) {
            Py_INCREF(ref);
            Py_SETREF(((PointerReleaseObject *)releaser)->handle, ref);
            bound = PyDict_SetItem(ptr_entries, address, ref);
        }
        Py_XDECREF(ref);
    }
    else {
        bound = pointer_cancel(address);
    }
    Py_DECREF(releaser);
    if (bound < 0) {
        /* the address must not stay reserved for good: cancel, then raise */
        PyObject *exc = take_exception();
        Py_DECREF(handle);
        if (pointer_cancel(address) < 0) {
            Py_XDECREF(exc);
            return NULL;
        }
        raise_exception(exc);
        return NULL;
    }
    return handle;
}

/* exitsafe.cffi.track's compiled form: what the cffi adapter learnt (see
 * exitsafe.cffi._CffiAdapter.pointer_address), and the Python function for the rest. */
static PyObject *cffi_track_py, *cffi_pins, *cffi_ffi_types, *cffi_pointer_ctypes;
/* id(release) -> (release, (pin,)): the pin the Python path found for a release function
 * given without `lib=`, or (release, (), id(registry)): none in that registry
 * (exitsafe._adapter.Adapter.release_pin_table), one table per adapter */
static PyObject *cffi_release_pins, *ctypes_release_pins;

/* Whether `release`, not a foreign function, shows nothing the Python path could follow to
 * a library (exitsafe._adapter._unwrapped): a builtin, or a Python function with no
 * `__wrapped__` (a lambda calling the library).  exitsafe.checked, functools.wraps and
 * functools.partial wrap a foreign function that has a library: the Python path. */
static PyObject *str_wrapped; /* "__wrapped__" */

static int
wraps_nothing(PyObject *release)
{
    if (PyCFunction_Check(release)) {
        return 1;
    }
    if (!PyFunction_Check(release)) {
        return 0;
    }
    PyObject *dict = ((PyFunctionObject *)release)->func_dict;
    if (dict == NULL) {
        return 1;
    }
    int has = PyDict_Contains(dict, str_wrapped);
    if (has < 0) {
        PyErr_Clear();
        return 0;
    }
    return !has;
}

/* The dependencies an adapter's track of `release` takes in `reg` while libraries are
 * pinned, from the adapter's `table` of pins found by release function: 1 with *deps NULL
 * when `foreign` is 0 and `release` wraps nothing (it is not one of the FFI's foreign
 * functions nor wraps one, so it belongs to no library: the Python path finds no pin for
 * it either) or when the Python path found
 * no pin of its library in `reg` since the last change of the pins, or with a new reference
 * to the tuple (pin,) the Python path found for this very function before, that pin still
 * live, owned and of `reg`; 0 when only the Python path can tell. */
static int
adapter_release_deps(PyObject *table, PyObject *release, int foreign, PyObject *reg,
                     PyObject **deps)
{
    *deps = NULL;
    if (!foreign) {
        return wraps_nothing(release);
    }
#ifdef Py_GIL_DISABLED
    return 0; /* (an entry read from the dict would be borrowed: the Python path) */
#else
    PyObject *key = PyLong_FromVoidPtr(release);
    PyObject *entry = key ? PyDict_GetItemWithError(table, key) : NULL;
    Py_XDECREF(key);
    if (entry == NULL || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) < 2
        || PyTuple_GET_ITEM(entry, 0) != release) {
        PyErr_Clear();
        return 0;
    }
    PyObject *found = PyTuple_GET_ITEM(entry, 1);
    if (PyTuple_GET_SIZE(entry) == 3) { /* (release, (), id(registry)): no pin in that one */
        PyObject *registry_id = PyTuple_GET_ITEM(entry, 2);
        int none = PyTuple_CheckExact(found) && PyTuple_GET_SIZE(found) == 0
                   && PyLong_CheckExact(registry_id) && PyLong_AsVoidPtr(registry_id) == reg;
        PyErr_Clear(); /* (an id out of range: not this registry) */
        return none;
    }
    if (PyTuple_GET_SIZE(entry) != 2) {
        return 0;
    }
    if (!PyTuple_CheckExact(found) || PyTuple_GET_SIZE(found) != 1
        || !PyObject_TypeCheck(PyTuple_GET_ITEM(found, 0), &NodeType)) {
        return 0;
    }
    NodeObject *pin = (NodeObject *)PyTuple_GET_ITEM(found, 0);
    /* (as the Python path: a released pin still waiting for its dependents has no owner and
     * takes no new one) */
    int live = pin->registry == reg && ival(pin->state) == LIVE && ival(pin->refs) > 0;
    if (PyErr_Occurred()) { /* (a state that is not an int) */
        PyErr_Clear();
        return 0;
    }
    if (!live) {
        return 0;
    }
    *deps = Py_NewRef(found);
    return 1;
#endif
}

/* exitsafe.HandleClosedError, found at its first use (a failure path) */
static PyObject *handle_closed_error;

/* After a failed pointer_track with the remembered `deps` (pin,): if the registration was
 * refused (HandleClosedError: raised before anything is registered or claimed; any other
 * error, e.g. from queued work run after a registration, is the caller's) because the pin
 * lost its last owner on another thread since adapter_release_deps saw it, clear the
 * exception: the Python path then decides again, as a track just after. */
static void
forgive_an_ended_pin(PyObject *deps)
{
    if (deps == NULL || !PyErr_Occurred()) {
        return;
    }
    NodeObject *pin = (NodeObject *)PyTuple_GET_ITEM(deps, 0);
    PyObject *exc = take_exception();
    if (handle_closed_error == NULL) {
        PyObject *errors = PyImport_ImportModule("exitsafe._errors");
        PyObject *found = errors ? PyObject_GetAttrString(errors, "HandleClosedError") : NULL;
        Py_XDECREF(errors);
        if (found != NULL && PyType_Check(found)) {
            handle_closed_error = found;
        }
        else {
            Py_XDECREF(found);
        }
        PyErr_Clear();
    }
    int ended = exc != NULL && handle_closed_error != NULL
                && PyObject_TypeCheck(exc, (PyTypeObject *)handle_closed_error)
                && ival(pin->refs) <= 0;
    PyErr_Clear(); /* (a refs that is not an int: not ended) */
    if (ended) {
        Py_DECREF(exc);
        return;
    }
    raise_exception(exc);
}

static PyObject *cffi_plain, *cffi_uintptr, *cffi_typeof, *cffi_cast;
/* A weak reference to the last FFI object found to make cdata of class cffi_plain (its
 * `CData`), or NULL: most programs track with one FFI, and an attribute lookup per call
 * would cost a fifth of the fast path. */
static PyObject *cffi_last_ffi;
/* cffi's own conversion of a cdata to the C pointer it holds (`_cffi_to_c_pointer`, entry 11
 * of the table every compiled cffi module uses, from the capsule `_cffi_backend._C_API`),
 * once checked against an address computed in Python; else NULL (then `cast` is used). */
typedef char *(*to_c_pointer_fn)(PyObject *, PyObject *);
static to_c_pointer_fn cffi_to_c_pointer;
#define CFFI_TO_C_POINTER 11
static PyObject *str_CData;

/* fast_kwargs for an adapter's track, whose `depends_on` may only be empty. */
static int
adapter_fast_kwargs(PyObject *const *kwvalues, PyObject *kwnames, PyObject **kind,
                    PyObject **regarg)
{
    PyObject *deps = NULL;
    return fast_kwargs(kwvalues, kwnames, kind, &deps, regarg)
           && (deps == NULL
               || ((PyTuple_CheckExact(deps) || PyList_CheckExact(deps)) && Py_SIZE(deps) == 0));
}

/* The registry an adapter's track owns the pointer in (`registry=` or the default one):
 * 1 with a new reference in *reg, 0 when the Python path must decide (not exactly an
 * exitsafe.Registry: a TypeError there, or a subclass that may override track()), -1 with
 * an exception. */
static int
adapter_registry(PyObject *regarg, PyObject **reg)
{
    if (regarg == Py_None) {
        *reg = default_registry_ref();
        if (*reg == NULL) {
            return -1;
        }
    }
    else {
        *reg = regarg;
        Py_INCREF(*reg);
    }
    if (Py_TYPE(*reg) != facade_type || ((FacadeObject *)*reg)->state == NULL
        || !is_fast_registry(((FacadeObject *)*reg)->state)) {
        Py_CLEAR(*reg);
        return 0;
    }
    return 1;
}

/* The common end of both adapters' compiled tracks: the registry (adapter_registry of
 * `regarg`), while libraries are pinned (`pins` not empty) the pin `release` needs
 * (adapter_release_deps over the adapter's `table`; `foreign` as there), then pointer_track.
 * Returns the handle, or NULL with an exception, or NULL without one when the Python path
 * must take the call (not exactly an exitsafe.Registry, the pin is not known, the address
 * is taken, or the pin lost its last owner meanwhile: forgive_an_ended_pin). */
static PyObject *
adapter_pointer_track(PyObject *pins, PyObject *table, PyObject *regarg, PyObject *ptr,
                      PyObject *release, int foreign, PyObject *address, PyObject *keep,
                      PyObject *kind)
{
    PyObject *facade;
    if (adapter_registry(regarg, &facade) != 1) {
        return NULL;
    }
    PyObject *deps = NULL, *handle = NULL;
    PyObject *reg = ((FacadeObject *)facade)->state;
    if (!PyDict_GET_SIZE(pins) || adapter_release_deps(table, release, foreign, reg, &deps)) {
        handle = pointer_track((RegistryObject *)reg, facade, ptr, release, address, keep, kind,
                               deps);
        if (handle == NULL) {
            forgive_an_ended_pin(deps); /* (then no exception is left: the Python path) */
        }
    }
    Py_XDECREF(deps);
    Py_DECREF(facade);
    return handle;
}

/* Whether `ffi` is an FFI the cffi adapter accepted (its type) whose cdata class is
 * `plain`, the pointer's: 1, else 0 (no error set).  The last one found is remembered. */
static int
cffi_known_ffi(PyObject *ffi, PyObject *plain)
{
    PyObject *last = cffi_last_ffi ? weak_target(cffi_last_ffi) : NULL;
    Py_XDECREF(last); /* compared by identity only: ffi is alive (an argument) */
    if (last == ffi) {
        return 1;
    }
    if (PySet_Contains(cffi_ffi_types, (PyObject *)Py_TYPE(ffi)) != 1) {
        PyErr_Clear();
        return 0;
    }
    PyObject *cdata_class = PyObject_GetAttr(ffi, str_CData);
    Py_XDECREF(cdata_class); /* compared by identity only; the class lives on */
    if (cdata_class != plain) {
        PyErr_Clear();
        return 0;
    }
#ifndef Py_GIL_DISABLED
    /* (without the GIL another thread could be reading the reference replaced here:
     * there, every call looks the class up) */
    PyObject *ref = PyWeakref_NewRef(ffi, NULL);
    if (ref == NULL) {
        PyErr_Clear(); /* an FFI without weak references: checked at every call */
    }
    Py_XSETREF(cffi_last_ffi, ref);
#endif
    return 1;
}

static PyObject *
cffi_track(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *kind = str_handle, *regarg = Py_None;
    if (nargs != 3 || cffi_track_py == NULL || the_lock == NULL || ptr_entries == NULL
        || !adapter_fast_kwargs(args + nargs, kwnames, &kind, &regarg)) {
        goto slow;
    }
    PyObject *ffi = args[0], *ptr = args[1], *release = args[2];
    PyObject *plain = LOAD_ACQUIRE(cffi_plain); /* (set last, with a release store) */
    if (plain == NULL || !PyUnicode_CheckExact(kind) || Py_TYPE(ptr) != (PyTypeObject *)plain
        || !PyCallable_Check(release)
        || LOAD(the_lock->owner) == PyThread_get_thread_ident()) {
        goto slow;
    }
    /* the checks the adapter learnt: an FFI it accepted, whose cdata class is that of the
     * pointer, and a C type it accepted; any failure or error: the Python path explains */
    if (!cffi_known_ffi(ffi, plain)) {
        goto slow;
    }
    PyObject *ctype = PyObject_Vectorcall(cffi_typeof, &ptr, 1, NULL);
    int pointer = ctype ? PySet_Contains(cffi_pointer_ctypes, ctype) : -1;
    if (pointer != 1) {
        Py_XDECREF(ctype);
        PyErr_Clear();
        goto slow;
    }
    PyObject *address;
    int nonzero;
    if (cffi_to_c_pointer != NULL) {
        char *value = cffi_to_c_pointer(ptr, ctype); /* the pointer, of its own C type */
        address = value != NULL ? PyLong_FromVoidPtr(value) : NULL;
        nonzero = address != NULL; /* (NULL, or an error: the Python path explains) */
    }
    else {
        PyObject *cast_args[2] = {cffi_uintptr, ptr};
        PyObject *number = PyObject_Vectorcall(cffi_cast, cast_args, 2, NULL);
        address = number ? PyNumber_Long(number) : NULL;
        Py_XDECREF(number);
        nonzero = address != NULL && PyObject_IsTrue(address) == 1;
    }
    Py_DECREF(ctype);
    if (!nonzero) { /* NULL: explained there */
        Py_XDECREF(address);
        PyErr_Clear();
        goto slow;
    }
    /* keep: what the release call needs referenced; the Python path keeps (ffi, lib).  A
     * Python function, builtin or method is not a cdata function of a library. */
    PyObject *handle = adapter_pointer_track(
        cffi_pins, cffi_release_pins, regarg, ptr, release,
        !(PyFunction_Check(release) || PyCFunction_Check(release) || PyMethod_Check(release)),
        address, ffi, kind);
    Py_DECREF(address);
    if (handle != NULL || PyErr_Occurred()) {
        return handle;
    }
    /* the address is taken: the Python path raises AlreadyTrackedError (or replaces an
     * entry whose handle is gone) */
slow:
    return PyObject_Vectorcall(cffi_track_py, args, nargs, kwnames);
}

/* exitsafe.ctypes.track's compiled form: an address given as an int, or read in place from
 * a c_void_p or POINTER(T) instance (subclasses included), and a release function that
 * needs no wrapping (not a foreign function without `argtypes`, which the Python path
 * wraps to pass an int as a pointer) and, while libraries are pinned, whose pin the Python
 * path found before (adapter_release_deps); the Python function for the rest.  Set by
 * setup_ctypes(). */
static PyObject *ctypes_track_py, *ctypes_pins, *ctypes_void_p, *ctypes_pointer,
    *ctypes_funcptr;
static PyObject *str_argtypes;

/* The address `ptr` stands for as a new int, or NULL (with no exception) when the Python
 * path must look at it: not an int, c_void_p or POINTER(T); NULL; negative; too large. */
static PyObject *
ctypes_address(PyObject *ptr)
{
    if (PyLong_CheckExact(ptr)) {
        unsigned long long value = PyLong_AsUnsignedLongLong(ptr);
        if ((value == (unsigned long long)-1 && PyErr_Occurred()) || value == 0
            || value > (unsigned long long)UINTPTR_MAX) {
            PyErr_Clear();
            return NULL;
        }
        Py_INCREF(ptr); /* the Python path's key is the int itself */
        return ptr;
    }
    if (!PyObject_TypeCheck(ptr, (PyTypeObject *)ctypes_void_p)
        && !PyObject_TypeCheck(ptr, (PyTypeObject *)ctypes_pointer)) {
        return NULL;
    }
    /* the pointer's own bytes, as the Python path reads them (c_void_p.from_buffer), and
     * only through ctypes' own buffer: a subclass's __buffer__ (3.12+) is user code, which
     * the Python path runs (and may refuse: a read-only buffer) */
    PyBufferProcs *own = ((PyTypeObject *)ctypes_void_p)->tp_as_buffer;
    PyBufferProcs *procs = Py_TYPE(ptr)->tp_as_buffer;
    if (own == NULL || procs == NULL || procs->bf_getbuffer != own->bf_getbuffer) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(ptr, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return NULL;
    }
    void *value = NULL;
    int ok = view.len == (Py_ssize_t)sizeof(value);
    if (ok) {
        memcpy(&value, view.buf, sizeof(value));
    }
    PyBuffer_Release(&view);
    return ok && value != NULL ? PyLong_FromVoidPtr(value) : NULL;
}

static PyObject *
ctypes_track(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *kind = str_handle, *regarg = Py_None;
    if (nargs != 2 || ctypes_track_py == NULL || the_lock == NULL || ptr_entries == NULL
        || !adapter_fast_kwargs(args + nargs, kwnames, &kind, &regarg)) {
        goto slow;
    }
    PyObject *ptr = args[0], *release = args[1];
    if (!PyUnicode_CheckExact(kind) || !PyCallable_Check(release)
        || LOAD(the_lock->owner) == PyThread_get_thread_ident()) {
        goto slow;
    }
    int funcptr = PyObject_TypeCheck(release, (PyTypeObject *)ctypes_funcptr);
    if (!funcptr && !PyFunction_Check(release) && !PyCFunction_Check(release)
        && !PyMethod_Check(release)) {
        /* as the Python path's isinstance(), which believes a __class__ attribute
         * (unittest.mock's spec=) */
        funcptr = PyObject_IsInstance(release, ctypes_funcptr);
        if (funcptr < 0) {
            PyErr_Clear();
            goto slow;
        }
    }
    if (funcptr) {
        PyObject *argtypes = PyObject_GetAttr(release, str_argtypes);
        Py_XDECREF(argtypes); /* compared with None only; the function holds it */
        if (argtypes == NULL || argtypes == Py_None) {
            PyErr_Clear();
            goto slow;
        }
    }
    PyObject *address = ctypes_address(ptr);
    if (address == NULL) {
        if (PyErr_Occurred()) {
            return NULL; /* out of memory */
        }
        goto slow;
    }
    /* keep: nothing more (a foreign function references its library itself) */
    PyObject *handle = adapter_pointer_track(ctypes_pins, ctypes_release_pins, regarg, ptr,
                                             release, funcptr, address, Py_None, kind);
    Py_DECREF(address);
    if (handle != NULL || PyErr_Occurred()) {
        return handle;
    }
    /* the address is taken: the Python path explains it */
slow:
    return PyObject_Vectorcall(ctypes_track_py, args, nargs, kwnames);
}

static PyMethodDef cffi_methods[] = {
    {"track", (PyCFunction)(void (*)(void))cffi_track, METH_FASTCALL | METH_KEYWORDS,
     "track(ffi, ptr, release, *, registry=None, lib=None, kind='handle', depends_on=(), "
     "exit_policy=None, name=None, timeout=None, affinity=None)\n--\n\n"
     "Own the native object `ptr` points to (see exitsafe.cffi.track)."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef ctypes_methods[] = {
    {"track", (PyCFunction)(void (*)(void))ctypes_track, METH_FASTCALL | METH_KEYWORDS,
     "track(ptr, release, *, registry=None, lib=None, kind='handle', depends_on=(), "
     "exit_policy=None, name=None, timeout=None, affinity=None)\n--\n\n"
     "Own the native object at `ptr` (see exitsafe.ctypes.track)."},
    {NULL, NULL, 0, NULL},
};

/* The compiled core keeps its state in process-wide C variables, set once by exitsafe's
 * modules at import in the main interpreter (exitsafe._core runs the pure-Python core in
 * any other).  Whether a setup function may set `state` (NULL until set): 0 with an
 * exception when called again or from another interpreter, whose objects would outlive it
 * in those variables. */
static int
may_set_up(PyObject *state, const char *what)
{
    if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s: the compiled core serves the main interpreter only", what);
        return 0;
    }
    if (state != NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s: already set up", what);
        return 0;
    }
    return 1;
}

/* main_interpreter() -> whether this is the main interpreter (the compiled core's) */
static PyObject *
main_interpreter(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(PyInterpreterState_Get() == PyInterpreterState_Main());
}

/* setup_pointers(entries, reserved, forget): the adapters' address table. */
static PyObject *
setup_pointers(PyObject *module, PyObject *args)
{
    PyObject *entries, *reserved, *forget;
    if (!may_set_up(ptr_entries, "setup_pointers()")
        || !PyArg_ParseTuple(args, "O!OO:setup_pointers", &PyDict_Type, &entries, &reserved,
                             &forget)) {
        return NULL;
    }
    if (!PyCallable_Check(forget)) {
        PyErr_SetString(PyExc_TypeError, "setup_pointers(): forget must be callable");
        return NULL;
    }
    Py_XSETREF(ptr_entries, Py_NewRef(entries));
    Py_XSETREF(ptr_reserved, Py_NewRef(reserved));
    Py_XSETREF(ptr_forget_py, Py_NewRef(forget));
    Py_RETURN_NONE;
}

/* An adapter's compiled track, the function `def` of the module named `module`, once the
 * Python function `slow` it hands every other case to is checked (`what` names the setup
 * function in the error); NULL with an exception. */
static PyObject *
adapter_track_function(PyObject *slow, const char *what, PyMethodDef *def, const char *module)
{
    if (!PyCallable_Check(slow)) {
        PyErr_Format(PyExc_TypeError, "%s: slow must be callable", what);
        return NULL;
    }
    PyObject *name = PyUnicode_FromString(module);
    if (name == NULL) {
        return NULL;
    }
    PyObject *fn = PyCFunction_NewEx(def, NULL, name);
    Py_DECREF(name);
    return fn;
}

/* setup_cffi(slow, pins, release_pins, ffi_types, pointer_ctypes) -> the compiled
 * exitsafe.cffi.track */
static PyObject *
setup_cffi(PyObject *module, PyObject *args)
{
    PyObject *slow, *pins, *release_pins, *ffi_types, *pointer_ctypes;
    if (!may_set_up(cffi_track_py, "setup_cffi()")
        || !PyArg_ParseTuple(args, "OO!O!O!O!:setup_cffi", &slow, &PyDict_Type, &pins,
                             &PyDict_Type, &release_pins, &PySet_Type, &ffi_types,
                             &PySet_Type, &pointer_ctypes)) {
        return NULL;
    }
    PyObject *fn = adapter_track_function(slow, "setup_cffi()", &cffi_methods[0],
                                          "exitsafe.cffi");
    if (fn == NULL) {
        return NULL;
    }
    Py_XSETREF(cffi_track_py, Py_NewRef(slow));
    Py_XSETREF(cffi_pins, Py_NewRef(pins));
    Py_XSETREF(cffi_release_pins, Py_NewRef(release_pins));
    Py_XSETREF(cffi_ffi_types, Py_NewRef(ffi_types));
    Py_XSETREF(cffi_pointer_ctypes, Py_NewRef(pointer_ctypes));
    return fn;
}

/* setup_ctypes(slow, pins, release_pins, c_void_p, pointer_base, funcptr_base) -> the
 * compiled exitsafe.ctypes.track (the tables: exitsafe._adapter.Adapter.pin_table and
 * release_pin_table; the types: ctypes.c_void_p, _ctypes._Pointer, _ctypes.CFuncPtr) */
static PyObject *
setup_ctypes(PyObject *module, PyObject *args)
{
    PyObject *slow, *pins, *release_pins, *void_p, *pointer, *funcptr;
    if (!may_set_up(ctypes_track_py, "setup_ctypes()")
        || !PyArg_ParseTuple(args, "OO!O!O!O!O!:setup_ctypes", &slow, &PyDict_Type, &pins,
                             &PyDict_Type, &release_pins, &PyType_Type, &void_p, &PyType_Type,
                             &pointer, &PyType_Type, &funcptr)) {
        return NULL;
    }
    PyObject *fn = adapter_track_function(slow, "setup_ctypes()", &ctypes_methods[0],
                                          "exitsafe.ctypes");
    if (fn == NULL) {
        return NULL;
    }
    Py_XSETREF(ctypes_pins, Py_NewRef(pins));
    Py_XSETREF(ctypes_release_pins, Py_NewRef(release_pins));
    Py_XSETREF(ctypes_void_p, Py_NewRef(void_p));
    Py_XSETREF(ctypes_pointer, Py_NewRef(pointer));
    Py_XSETREF(ctypes_funcptr, Py_NewRef(funcptr));
    Py_XSETREF(ctypes_track_py, Py_NewRef(slow)); /* (all set before the function exists) */
    return fn;
}

/* cffi_learned(plain, uintptr, typeof, cast, api, sample, address): the cdata class of plain
 * pointers, the C type uintptr_t, the backend's typeof and cast and its C API capsule, once
 * the adapter accepted the pointer `sample` at `address`. */
static PyObject *
cffi_learned(PyObject *module, PyObject *args)
{
    PyObject *plain, *uintptr, *typeof_fn, *cast_fn, *api, *sample, *address;
    if (!PyArg_ParseTuple(args, "O!OOOOOO!:cffi_learned", &PyType_Type, &plain, &uintptr,
                          &typeof_fn, &cast_fn, &api, &sample, &PyLong_Type, &address)) {
        return NULL;
    }
    if (!PyCallable_Check(typeof_fn) || !PyCallable_Check(cast_fn)) {
        PyErr_SetString(PyExc_TypeError, "cffi_learned(): typeof and cast must be callable");
        return NULL;
    }
    if (cffi_to_c_pointer == NULL && PyCapsule_IsValid(api, "cffi")) {
        /* take cffi's conversion only if it finds the address the Python checks found */
        void **exports = (void **)PyCapsule_GetPointer(api, "cffi");
        PyObject *ctype = exports ? PyObject_Vectorcall(typeof_fn, &sample, 1, NULL) : NULL;
        if (ctype != NULL && exports[CFFI_TO_C_POINTER] != NULL) {
            to_c_pointer_fn fn = (to_c_pointer_fn)exports[CFFI_TO_C_POINTER];
            char *value = fn(sample, ctype);
            void *expected = PyLong_AsVoidPtr(address);
            if (!PyErr_Occurred() && value != NULL && value == (char *)expected) {
                cffi_to_c_pointer = fn;
            }
        }
        Py_XDECREF(ctype);
        PyErr_Clear(); /* whatever failed: the cast stays in use */
    }
#ifdef Py_GIL_DISABLED
    static PyMutex learning; /* two first learners at once: one sets, the other returns */
    PyMutex_Lock(&learning);
#endif
    if (LOAD_ACQUIRE(cffi_plain) == NULL) {
        /* learnt once: the same objects every time (one cffi backend per process), and
         * never replaced under a reader on another thread */
        cffi_uintptr = Py_NewRef(uintptr);
        cffi_typeof = Py_NewRef(typeof_fn);
        cffi_cast = Py_NewRef(cast_fn);
        Py_INCREF(plain);
        STORE_RELEASE(cffi_plain, plain); /* last: it turns the fast path on */
    }
#ifdef Py_GIL_DISABLED
    PyMutex_Unlock(&learning);
#endif
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the exit teardown */

static PyObject *str_release, *str_facade;

/* release_steps(order, start, decided, default_policy, elsewhere, released) -> (index, exc)
 *
 * The teardown executor's common step (exitsafe._teardown.run), for order[start:]: a
 * handle with the policy "release", no taint, no affinity, no borrow, no timeout, of this
 * process,
 * claimed by this teardown (not in `elsewhere`): its release function is called and
 * decided[node] = released (the pair (released_at_exit, None)), its state RELEASED.  It
 * stops before the first node that needs the general step, returning (its index, None),
 * or after a release function raised, returning (that node's index, the exception), which
 * the caller records.  The caller runs it only when no override, deadline, step timeout
 * or trace applies to the teardown. */
static PyObject *
release_steps(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[2])
        || !PyTuple_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "release_steps(order: list, start, decided: dict, default_policy, "
                        "elsewhere, released: tuple)");
        return NULL;
    }
    PyObject *order = args[0], *decided = args[2], *default_policy = args[3];
    PyObject *elsewhere = args[4], *released = args[5];
    Py_ssize_t i = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (i == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int check_elsewhere = PyAnySet_Check(elsewhere) && PySet_GET_SIZE(elsewhere) > 0;
    if (i < 0) {
        i = 0;
    }
    for (; i < PyList_GET_SIZE(order); i++) {
        PyObject *op = PyList_GET_ITEM(order, i);
        if (!PyObject_TypeCheck(op, &NodeType)) {
            break;
        }
        NodeObject *n = (NodeObject *)op;
        if (check_elsewhere) {
            int in = PySet_Contains(elsewhere, op);
            if (in < 0) {
                return NULL;
            }
            if (in) {
                break;
            }
        }
        PyObject *policy = extra_field(n, offsetof(NodeExtra, policy));
        if (policy == Py_None) {
            policy = default_policy;
        }
        if (policy != str_release
            && !(PyUnicode_CheckExact(policy) && PyUnicode_Compare(policy, str_release) == 0)) {
            break;
        }
        if (ival(n->role) == HOOK_ROLE || extra_field(n, offsetof(NodeExtra, taint)) != Py_None
            || extra_field(n, offsetof(NodeExtra, affinity)) != Py_None
            || ival(n->borrows) != 0 || extra_field(n, offsetof(NodeExtra, timeout)) != Py_None
            || n->gen != generation || n->fn == NULL || n->raw == NULL) {
            PyErr_Clear(); /* (a field that is not an int: the general step explains) */
            break;
        }
        PyObject *fn = n->fn, *raw = n->raw;
        Py_INCREF(op);
        Py_INCREF(fn);
        Py_INCREF(raw);
        PyObject *r = PyObject_CallOneArg(fn, raw);
        Py_DECREF(fn);
        Py_DECREF(raw);
        if (r == NULL) {
            Py_DECREF(op);
            PyObject *exc = take_exception();
            return Py_BuildValue("(nN)", i, exc);
        }
        Py_DECREF(r);
        int rc = PyDict_SetItem(decided, op, released);
        iset(&n->state, RELEASED);
        Py_DECREF(op);
        if (rc < 0) {
            return NULL;
        }
    }
    return Py_BuildValue("(nO)", i, Py_None);
}

static int record_one(PyObject *regobj, PyObject *op, PyObject *outcome, PyObject *detail,
                      int fast_registry, int check_elsewhere, PyObject *elsewhere,
                      PyObject *finish, PyObject *trash, int untrack);

/* record_exit_outcomes(registry, decided, position, count, elsewhere, finish, trash,
 *                      untrack=False)
 *     -> the next position, or None when every outcome is recorded
 *
 * The end of a teardown (exitsafe._closing._close), in one of its sections: for `count`
 * entries node -> (outcome, detail) of the dict `decided` from `position` (0 first, then
 * what the previous call returned; the dict must not change meanwhile), what
 * Registry._finish(node, outcome, detail, True, trash, node not in elsewhere) does.  A
 * handle released by the teardown itself is recorded here (state, ledger record, its
 * parents' dependent counts, what it drops into `trash`); every other outcome, a hook, or a
 * registry with unusual fields calls `finish` (Registry._finish).  The caller holds the
 * lock.
 *
 * `untrack` (the process ends: exitsafe._process.process_ending()): each handle recorded
 * here also leaves the garbage collector's lists.  It has ended and holds nothing but its
 * registry's state and strings (its raw object, release function and parents went to the
 * trash; its policy, taint, timeout and affinity are None or a string), so no garbage
 * cycle can go through it unless through its class or its registry's: only handles of
 * the class track() makes (no __dict__, no slot of a subclass) in a registry whose facade
 * is exitsafe.Registry itself (which has no __dict__ either) are untracked.  The
 * interpreter's last collections then skip them instead of traversing each of them
 * several times on the way out (they are freed by their reference counts as before). */
static PyObject *
record_exit_outcomes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 7 && nargs != 8) || !PyDict_CheckExact(args[1])
        || !PyList_CheckExact(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "record_exit_outcomes(registry, decided: dict, position, count, "
                        "elsewhere, finish, trash: list, untrack=False)");
        return NULL;
    }
    PyObject *regobj = args[0], *decided = args[1], *elsewhere = args[4], *finish = args[5];
    PyObject *trash = args[6];
    Py_ssize_t position = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    Py_ssize_t count = PyNumber_AsSsize_t(args[3], PyExc_OverflowError);
    if ((position == -1 || count == -1) && PyErr_Occurred()) {
        return NULL;
    }
    if (position < 0) {
        PyErr_SetString(PyExc_ValueError, "record_exit_outcomes(): position must be >= 0");
        return NULL;
    }
    int fast_registry = is_fast_registry(regobj) && LOAD(((RegistryObject *)regobj)->phase)
                                                      != PHASE_OPEN;
    int check_elsewhere = PyAnySet_Check(elsewhere) && PySet_GET_SIZE(elsewhere) > 0;
    int untrack = 0;
    if (nargs == 8 && fast_registry && handle_type != NULL && facade_type != NULL) {
        untrack = PyObject_IsTrue(args[7]);
        if (untrack < 0) {
            return NULL;
        }
        if (untrack) {
            PyObject *facade = PyObject_GetAttr(regobj, str_facade);
            if (facade == NULL) {
                return NULL;
            }
            untrack = Py_TYPE(facade) == facade_type;
            Py_DECREF(facade);
        }
    }
    PyObject *op, *value;
    for (Py_ssize_t done = 0; done < count; done++) {
        if (!PyDict_Next(decided, &position, &op, &value)) {
            Py_RETURN_NONE;
        }
        if (!PyTuple_CheckExact(value) || PyTuple_GET_SIZE(value) != 2) {
            PyErr_SetString(PyExc_TypeError,
                            "record_exit_outcomes(): decided maps nodes to (outcome, detail)");
            return NULL;
        }
        Py_INCREF(op); /* (the dict holds them; kept through the calls below all the same) */
        Py_INCREF(value);
        PyObject *outcome = PyTuple_GET_ITEM(value, 0);
        PyObject *detail = PyTuple_GET_ITEM(value, 1);
        int rc = record_one(regobj, op, outcome, detail, fast_registry, check_elsewhere,
                            elsewhere, finish, trash, untrack);
        Py_DECREF(op);
        Py_DECREF(value);
        if (rc < 0) {
            return NULL;
        }
    }
    return PyLong_FromSsize_t(position);
}

/* Whether an ended handle's kind and optional fields are None, strings or numbers only:
 * nothing through which a garbage cycle could go (see record_exit_outcomes). */
static int
holds_only_values(NodeObject *n)
{
    if (n->kind == NULL || !PyUnicode_CheckExact(n->kind)) {
        return 0;
    }
    NodeExtra *x = LOAD_ACQUIRE(n->extra);
    if (x == NULL) {
        return 1;
    }
    PyObject *fields[5] = {x->name, x->policy, x->timeout, x->taint, x->affinity};
    for (int i = 0; i < 5; i++) {
        PyObject *v = fields[i];
        if (v != NULL && v != Py_None && !PyUnicode_CheckExact(v) && !PyFloat_CheckExact(v)
            && !PyLong_CheckExact(v)) {
            return 0;
        }
    }
    return 1;
}

/* One outcome of record_exit_outcomes. */
static int
record_one(PyObject *regobj, PyObject *op, PyObject *outcome, PyObject *detail,
           int fast_registry, int check_elsewhere, PyObject *elsewhere, PyObject *finish,
           PyObject *trash, int untrack)
{
    int mine = 1;
    if (check_elsewhere) {
        int in = PySet_Contains(elsewhere, op);
        if (in < 0) {
            return -1;
        }
        mine = !in;
    }
    NodeObject *n = (NodeObject *)op;
    int fast = fast_registry && mine && detail == Py_None && PyObject_TypeCheck(op, &NodeType)
               && n->registry == regobj && ival(n->role) != HOOK_ROLE;
    if (PyErr_Occurred()) { /* a role that is not an int: Registry._finish decides */
        PyErr_Clear();
        fast = 0;
    }
    if (fast && n->parents != NULL
        && PyTuple_CheckExact(n->parents)
        && (outcome == released_at_exit_str
            || (PyUnicode_CheckExact(outcome)
                && PyUnicode_Compare(outcome, released_at_exit_str) == 0))) {
        RegistryObject *reg = (RegistryObject *)regobj;
        iset(&n->state, RELEASED);
        n->releaser = 1; /* ENDED_AT_EXIT */
        NodeObject *owned = live_unlink(n);
        if (owned != NULL && PyList_Append(trash, (PyObject *)owned) < 0) {
            Py_DECREF(owned);
            return -1;
        }
        Py_XDECREF((PyObject *)owned); /* (the trash list holds it) */
        if (append_record(reg, n, 1) < 0) {
            return -1;
        }
        PyObject *parents = n->parents;
        Py_ssize_t count = PyTuple_GET_SIZE(parents);
        for (Py_ssize_t k = 0; k < count; k++) {
            NodeObject *parent = (NodeObject *)PyTuple_GET_ITEM(parents, k);
            iset_counter(&parent->children, ival(parent->children) - 1);
            if (parent->children == NULL) {
                return -1;
            }
        }
        /* what it drops goes to the trash, cleared after the section */
        if ((n->raw && PyList_Append(trash, n->raw) < 0)
            || (n->fn && PyList_Append(trash, n->fn) < 0)
            || PyList_Append(trash, parents) < 0) {
            return -1;
        }
        PyObject *old_raw = n->raw, *old_fn = n->fn;
        n->raw = Py_NewRef(Py_None);
        n->fn = Py_NewRef(Py_None);
        n->parents = PyTuple_New(0); /* the shared empty tuple */
        Py_XDECREF(old_raw); /* (each also held by the trash list) */
        Py_XDECREF(old_fn);
        Py_DECREF(parents);
        if (untrack && Py_TYPE(op) == handle_type && n->parents != NULL
            && PyTuple_GET_SIZE(n->parents) == 0 && holds_only_values(n)) {
            PyObject_GC_UnTrack(op); /* (see record_exit_outcomes) */
        }
        return 0;
    }
    PyObject *fargs[6] = {op, outcome, detail, Py_True, trash, mine ? Py_True : Py_False};
    PyObject *r = PyObject_Vectorcall(finish, fargs, 6, NULL);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* claim(nodes, me) -> the set of the nodes some thread was already releasing
 *
 * exitsafe._teardown.claim for a list of nodes: every live one is marked as being released
 * by the thread `me` (the teardown's).  Called under the lock, in the section that begins
 * the teardown; it allocates only the set it returns. */
static PyObject *
claim_nodes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "claim(nodes: list, me: int)");
        return NULL;
    }
    unsigned long me = PyLong_AsUnsignedLong(args[1]);
    if (me == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *nodes = args[0];
    PyObject *elsewhere = PySet_New(NULL);
    if (elsewhere == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); i++) {
        PyObject *op = PyList_GET_ITEM(nodes, i);
        if (!PyObject_TypeCheck(op, &NodeType)) {
            Py_DECREF(elsewhere);
            PyErr_SetString(PyExc_TypeError, "claim(): nodes must be handles");
            return NULL;
        }
        NodeObject *n = (NodeObject *)op;
        if (ival(n->state) == LIVE) {
            iset(&n->state, RELEASING);
            n->releaser = me;
        }
        else if (PySet_Add(elsewhere, op) < 0) {
            Py_DECREF(elsewhere);
            return NULL;
        }
    }
    return elsewhere;
}

/* teardown_order(nodes) -> list, or None
 *
 * exitsafe._graph.teardown_order in C, the same Kahn's algorithm and the same order: among
 * the ready nodes hooks first, then handles, then libraries, newest first within a role;
 * each node's parents read once; parents outside `nodes` ignored.  Returns None (the
 * caller then runs the Python function) for anything but compiled handles, or a node
 * given twice that another one depends on.  `nodes` must be distinct (a live table's are):
 * a repeated node nothing depends on is not looked for, since only the nodes named as
 * parents are hashed (a process ending with 10^6 independent handles hashes none). */
typedef struct {
    PyObject *node;   /* a node named as a parent (borrowed from a parents tuple) */
    Py_ssize_t index; /* its index in `nodes`, or -1 while not found there */
    Py_ssize_t count; /* its dependents among the nodes not yet ordered */
} PlanSlot;

static inline size_t
plan_hash(PyObject *node, size_t mask)
{
    size_t h = (size_t)(uintptr_t)node >> 4;
    h *= (size_t)0x9E3779B97F4A7C15ULL;
    return (h ^ (h >> 29)) & mask;
}

/* The slot of `node`, inserted (index -1, count 0) if `insert`; NULL if absent. */
static PlanSlot *
plan_slot(PlanSlot *slots, size_t mask, PyObject *node, int insert)
{
    for (size_t i = plan_hash(node, mask);; i = (i + 1) & mask) {
        if (slots[i].node == node) {
            return &slots[i];
        }
        if (slots[i].node == NULL) {
            if (!insert) {
                return NULL;
            }
            slots[i].node = node;
            slots[i].index = -1;
            return &slots[i];
        }
    }
}

/* Read the parents of each of `items` (n nodes) into parents_of (strong references) and
 * count the edges into *edges.  Returns 0 when the Python function must plan instead (an
 * item that is not a compiled node, a role or parents of an unexpected type), else 1. */
static int
plan_read(PyObject **items, Py_ssize_t n, PyObject **parents_of, size_t *edges)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *node = items[i];
        if (!PyObject_TypeCheck(node, &NodeType)) {
            return 0;
        }
        NodeObject *nd = (NodeObject *)node;
        long role = ival(nd->role);
        if (role < HOOK_ROLE || role > LIBRARY_ROLE) {
            PyErr_Clear(); /* (a role that is not an int) */
            return 0;
        }
#ifdef Py_GIL_DISABLED
        /* another thread finishing a release may replace the tuple meanwhile: read it as
         * the attribute (a safe load), not the field */
        PyObject *parents = PyObject_GetAttrString(node, "_parents");
        if (parents == NULL) {
            PyErr_Clear();
        }
#else
        PyObject *parents = nd->parents;
        Py_XINCREF(parents);
#endif
        parents_of[i] = parents;
        if (parents == NULL || !PyTuple_CheckExact(parents)) {
            return 0;
        }
        *edges += (size_t)PyTuple_GET_SIZE(parents);
    }
    return 1;
}

/* Fill `slots` (a table of mask + 1 entries) with the nodes named as parents: their
 * dependents among `items`, their index there.  Returns 0 when a node is given twice
 * (the Python function decides), else 1. */
static int
plan_index(PlanSlot *slots, size_t mask, PyObject **items, Py_ssize_t n,
           PyObject **parents_of)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *parents = parents_of[i];
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(parents); j++) {
            plan_slot(slots, mask, PyTuple_GET_ITEM(parents, j), 1)->count++;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PlanSlot *slot = plan_slot(slots, mask, items[i], 0);
        if (slot != NULL) {
            if (slot->index >= 0) {
                return 0;
            }
            slot->index = i;
        }
    }
    return 1;
}

/* The order itself: a node is placed once none of its dependents among `items` is left,
 * hooks first, then handles, then libraries, each kind newest ready first (three stacks
 * of indices in `stack`, an array of 3n).  A new list, or NULL with an error set. */
static PyObject *
plan_place(PyObject **items, Py_ssize_t n, PyObject **parents_of, PlanSlot *slots,
           size_t mask, Py_ssize_t *stack)
{
    Py_ssize_t *stacks[3] = {stack, stack + n, stack + 2 * n};
    Py_ssize_t depth[3] = {0, 0, 0};
    for (Py_ssize_t i = 0; i < n; i++) {
        PlanSlot *slot = slots != NULL ? plan_slot(slots, mask, items[i], 0) : NULL;
        if (slot == NULL || slot->count == 0) {
            long role = ival(((NodeObject *)items[i])->role);
            stacks[role][depth[role]++] = i;
        }
    }
    PyObject *order = PyList_New(n);
    if (order == NULL) {
        return NULL;
    }
    Py_ssize_t placed = 0;
    for (;;) {
        Py_ssize_t i;
        if (depth[HOOK_ROLE]) {
            i = stacks[HOOK_ROLE][--depth[HOOK_ROLE]];
        }
        else if (depth[HANDLE_ROLE]) {
            i = stacks[HANDLE_ROLE][--depth[HANDLE_ROLE]];
        }
        else if (depth[LIBRARY_ROLE]) {
            i = stacks[LIBRARY_ROLE][--depth[LIBRARY_ROLE]];
        }
        else {
            break;
        }
        if (placed >= n) { /* cannot happen: each node is ready once */
            break;
        }
        Py_INCREF(items[i]);
        PyList_SET_ITEM(order, placed++, items[i]);
        PyObject *parents = parents_of[i];
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(parents); j++) {
            PlanSlot *parent = plan_slot(slots, mask, PyTuple_GET_ITEM(parents, j), 0);
            if (parent != NULL && parent->index >= 0 && --parent->count == 0) {
                long role = ival(((NodeObject *)items[parent->index])->role);
                stacks[role][depth[role]++] = parent->index;
            }
        }
    }
    if (placed != n) {
        Py_DECREF(order);
        PyErr_SetString(PyExc_AssertionError,
                        "exitsafe: the handle graph has a cycle; this is a bug");
        return NULL;
    }
    return order;
}

static PyObject *
plan_teardown_order(PyObject *module, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "teardown_order() needs a sequence of nodes");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    size_t room = (size_t)(n > 0 ? n : 1);
    PyObject **parents_of = PyMem_Calloc(room, sizeof(PyObject *)); /* read once, strong */
    Py_ssize_t *stack = PyMem_Malloc(sizeof(Py_ssize_t) * room * 3);
    PlanSlot *slots = NULL;
    size_t mask = 0;
    PyObject *order = NULL;
    int fallback = 0;
    size_t edges = 0;
    if (parents_of == NULL || stack == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (!plan_read(items, n, parents_of, &edges)) {
        fallback = 1;
        goto done;
    }
    if (edges) {
        /* the nodes named as parents: their dependents among `nodes`, their index there */
        size_t cap = 8;
        while (cap < edges * 2) {
            cap <<= 1;
        }
        mask = cap - 1;
        slots = PyMem_Calloc(cap, sizeof(PlanSlot));
        if (slots == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (!plan_index(slots, mask, items, n, parents_of)) {
            fallback = 1;
            goto done;
        }
    }
    order = plan_place(items, n, parents_of, slots, mask, stack);
done:
    if (parents_of != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_XDECREF(parents_of[i]);
        }
    }
    PyMem_Free(parents_of);
    PyMem_Free(slots);
    PyMem_Free(stack);
    Py_DECREF(seq);
    if (fallback) {
        Py_XDECREF(order);
        Py_RETURN_NONE;
    }
    return order;
}

static PyTypeObject RegistryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exitsafe._speedups.RegistryCore",
    .tp_basicsize = sizeof(RegistryObject),
    .tp_dealloc = (destructor)Registry_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The compiled fields of a registry's state (the base of "
              "exitsafe._state.RegistryState).",
    .tp_traverse = (traverseproc)Registry_traverse,
    .tp_clear = (inquiry)Registry_clear,
    .tp_members = Registry_members,
};

/* ------------------------------------------------------------------ module functions */

/* setup(**callbacks): every name below, keyword-only, each checked for its kind. */
static struct {
    const char *name;
    PyObject **slot;
    PyTypeObject *type; /* the exact type required, or NULL for any callable */
} setup_slots[] = {
    {"lock", (PyObject **)&the_lock, &LockType},
    {"handle_type", (PyObject **)&handle_type, &PyType_Type},
    {"registry_type", (PyObject **)&registry_type, &PyType_Type},
    {"facade_type", (PyObject **)&facade_type, &PyType_Type},
    {"track", &track_py, NULL},
    {"drop_owner", &drop_owner_py, NULL},
    {"retain", &retain_py, NULL},
    {"collected", &collected_py, NULL},
    {"release_chain", &release_chain_py, NULL},
    {"release_failed", &release_failed_py, NULL},
    {"collected_failed", &collected_failed_py, NULL},
    {"registered_after_close", &registered_after_close_py, NULL},
    {"undo_track", &undo_track_py, NULL},
    {"wait", &sync_wait, NULL},
    {"deferred", &deferred_list, &PyList_Type},
    {"run_deferred", &run_deferred, NULL},
    {"affine", &affine_dict, &PyDict_Type},
    {"run_mine", &run_mine, NULL},
    {"default_list", &default_list, &PyList_Type},
    {"default_registry", &default_registry_py, NULL},
    {"released", &released_str, &PyUnicode_Type},
    {"released_at_exit", &released_at_exit_str, &PyUnicode_Type},
};
#define SETUP_SLOTS ((Py_ssize_t)(sizeof(setup_slots) / sizeof(setup_slots[0])))

static PyObject *
setup(PyObject *module, PyObject *args, PyObject *kwds)
{
    if (!may_set_up((PyObject *)the_lock, "setup()")) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(args) || kwds == NULL || PyDict_GET_SIZE(kwds) != SETUP_SLOTS) {
        PyErr_Format(PyExc_TypeError, "setup() takes exactly %zd keyword arguments",
                     SETUP_SLOTS);
        return NULL;
    }
    PyObject *values[SETUP_SLOTS];
    for (Py_ssize_t i = 0; i < SETUP_SLOTS; i++) {
        PyObject *value = PyDict_GetItemString(kwds, setup_slots[i].name);
        PyTypeObject *type = setup_slots[i].type;
        if (value == NULL || (type != NULL && Py_TYPE(value) != type)
            || (type == NULL && !PyCallable_Check(value))) {
            PyErr_Format(PyExc_TypeError, "setup(): %s missing or of the wrong type",
                         setup_slots[i].name);
            return NULL;
        }
        values[i] = value;
    }
    if (!PyType_IsSubtype((PyTypeObject *)values[1], &NodeType)) {
        PyErr_SetString(PyExc_TypeError, "setup(): handle_type must be a subclass of Node");
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)values[2], &RegistryType)) {
        PyErr_SetString(PyExc_TypeError,
                        "setup(): registry_type must be a subclass of RegistryCore");
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)values[3], &FacadeType)) {
        PyErr_SetString(PyExc_TypeError,
                        "setup(): facade_type must be a subclass of RegistryBase");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < SETUP_SLOTS; i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*setup_slots[i].slot, values[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[];

/* set_doc(owner, name, doc): give the compiled `owner.name` ("module", "RegistryBase",
 * "Node", "cffi" or "ctypes") the docstring of the Python function it stands for, after its own signature
 * line.  Docstrings are read from the method table whenever asked for, so help(),
 * inspect and the documentation checks see the same text for both cores. */
static PyObject *
set_doc(PyObject *module, PyObject *args)
{
    const char *owner, *name, *doc;
    if (!PyArg_ParseTuple(args, "sss:set_doc", &owner, &name, &doc)) {
        return NULL;
    }
    PyMethodDef *table = strcmp(owner, "module") == 0         ? module_methods
                         : strcmp(owner, "RegistryBase") == 0 ? Facade_methods
                         : strcmp(owner, "Node") == 0         ? Node_methods
                         : strcmp(owner, "cffi") == 0         ? cffi_methods
                         : strcmp(owner, "ctypes") == 0       ? ctypes_methods
                                                              : NULL;
    for (PyMethodDef *m = table; m != NULL && m->ml_name != NULL; m++) {
        if (strcmp(m->ml_name, name) != 0) {
            continue;
        }
        const char *old = m->ml_doc ? m->ml_doc : "";
        const char *end = strstr(old, "\n--\n\n");
        size_t header = end ? (size_t)(end - old) + 5 : 0;
        size_t size = header + strlen(doc) + 1;
        char *text = PyMem_RawMalloc(size); /* kept for the life of the process */
        if (text == NULL) {
            return PyErr_NoMemory();
        }
        memcpy(text, old, header);
        memcpy(text + header, doc, strlen(doc) + 1);
        m->ml_doc = text;
        Py_RETURN_NONE;
    }
    PyErr_Format(PyExc_ValueError, "set_doc(): no compiled %s.%s", owner, name);
    return NULL;
}

static PyObject *
set_generation(PyObject *module, PyObject *arg)
{
    Py_ssize_t value = PyLong_AsSsize_t(arg);
    if (value == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (value < 0 || value > INT_MAX) {
        PyErr_Format(PyExc_OverflowError, "fork generation %zd out of range", value);
        return NULL;
    }
    generation = value;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"track", (PyCFunction)(void (*)(void))module_track, METH_FASTCALL | METH_KEYWORDS,
     "track(raw, release, kind='handle', depends_on=(), exit_policy=None, name=None, "
     "timeout=None, affinity=None)\n--\n\n"
     "Start owning `raw` in the default registry (see exitsafe.track)."},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "Connect the compiled core to exitsafe's Python layers (exitsafe._registry, once)."},
    {"set_doc", set_doc, METH_VARARGS,
     "Give a compiled function the docstring of the Python function it stands for."},
    {"set_generation", set_generation, METH_O,
     "Mirror exitsafe._sync.generation (the fork generation) into the compiled core."},
    {"claim", (PyCFunction)(void (*)(void))claim_nodes, METH_FASTCALL,
     "Claim a teardown's live nodes for its thread (see exitsafe._teardown.claim)."},
    {"teardown_order", plan_teardown_order, METH_O,
     "The teardown's order of distinct compiled handles, or None (see exitsafe._graph)."},
    {"release_steps", (PyCFunction)(void (*)(void))release_steps, METH_FASTCALL,
     "The teardown's common steps, from an index of its order (see exitsafe._teardown.run)."},
    {"record_exit_outcomes", (PyCFunction)(void (*)(void))record_exit_outcomes, METH_FASTCALL,
     "Record a teardown's outcomes in a section (see exitsafe._closing._close)."},
    {"count_outcomes", (PyCFunction)(void (*)(void))count_outcomes, METH_FASTCALL,
     "Add the outcomes of records[:stop] to counts (see exitsafe._ledger.Ledger.trim)."},
    {"setup_pointers", setup_pointers, METH_VARARGS,
     "Connect the compiled pointer release to the adapters' address table (once)."},
    {"setup_cffi", setup_cffi, METH_VARARGS,
     "Connect exitsafe.cffi's compiled track to the adapter; returns that function."},
    {"main_interpreter", main_interpreter, METH_NOARGS,
     "Whether this is the main interpreter (the only one the compiled core serves)."},
    {"setup_ctypes", setup_ctypes, METH_VARARGS,
     "Connect exitsafe.ctypes' compiled track to the adapter; returns that function."},
    {"cffi_learned", cffi_learned, METH_VARARGS,
     "What the cffi adapter learnt from a pointer it accepted (turns its fast path on)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "exitsafe._speedups",
    .m_doc = "The optional compiled core of exitsafe's hot path (see exitsafe._core).",
    .m_size = -1,
    .m_methods = module_methods,
};

static PyObject *
intern(const char *s)
{
    return PyUnicode_InternFromString(s);
}

PyMODINIT_FUNC
PyInit__speedups(void)
{
#ifdef Py_GIL_DISABLED
    PyErr_SetString(PyExc_ImportError,
                    "exitsafe's compiled core is not used on a free-threaded build: the "
                    "pure-Python core runs there (see exitsafe._core)");
    return NULL;
#endif
    NodeType.tp_new = PyBaseObject_Type.tp_new;
    RegistryType.tp_new = PyBaseObject_Type.tp_new;
    FacadeType.tp_new = PyBaseObject_Type.tp_new;
    if (PyType_Ready(&LockType) < 0 || PyType_Ready(&NodeType) < 0 || PyType_Ready(&LiveTableType) < 0
        || PyType_Ready(&RecordType) < 0 || PyType_Ready(&PointerReleaseType) < 0
        || PyType_Ready(&RegistryType) < 0 || PyType_Ready(&FacadeType) < 0) {
        return NULL;
    }
    if (!(str_handle = intern("handle")) || !(str_library = intern("library"))
        || !(str_trim = intern("trim")) || !(str_ledger = intern("ledger"))
        || !(kw_kind = intern("kind")) || !(kw_depends_on = intern("depends_on"))
        || !(kw_exit_policy = intern("exit_policy")) || !(kw_name = intern("name"))
        || !(kw_timeout = intern("timeout")) || !(kw_affinity = intern("affinity"))
        || !(kw_registry = intern("registry")) || !(kw_lib = intern("lib"))
        || !(str_CData = intern("CData")) || !(str_argtypes = intern("argtypes"))
        || !(str_wrapped = intern("__wrapped__")) || !(str_release = intern("release"))
        || !(str_facade = intern("facade")) || !(kind_names = PyTuple_Pack(1, kw_kind))
        || !(kind_deps_names = PyTuple_Pack(2, kw_kind, kw_depends_on))) {
        return NULL;
    }
    for (long i = 0; i < SMALL_INTS; i++) {
        if ((small[i] = PyLong_FromLong(i)) == NULL) {
            return NULL;
        }
    }
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL) {
        return NULL;
    }
    static const struct {
        const char *name;
        PyTypeObject *type;
    } exported[] = {
        {"PointerRelease", &PointerReleaseType}, {"LiveTable", &LiveTableType},
        {"Lock", &LockType}, {"Node", &NodeType}, {"RegistryCore", &RegistryType},
        {"RegistryBase", &FacadeType},
    };
    for (size_t i = 0; i < sizeof(exported) / sizeof(exported[0]); i++) {
        Py_INCREF(exported[i].type);
        if (PyModule_AddObject(m, exported[i].name, (PyObject *)exported[i].type) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
