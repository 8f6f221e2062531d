/* The memory tier's one-block read in C: the lock-free fast path of MemoryTier.get_into.
 *
 * get1(index, key, out, touched) -> [header] | None
 *
 * Looks ``key`` up in ``index`` (a dict of _Block), copies the block's single slot
 * (``whole``) into ``out`` (a writable C-contiguous buffer of exactly its length) with the
 * GIL released, then checks that the slot was not freed meanwhile and that the stored header
 * still equals the one written; on success it appends ``key`` to ``touched`` (the recency
 * queue) and returns ``[block.header]``. Anything else (a miss, another buffer, a block in
 * several slots or encoded, a failed check) returns None and the Python path decides, so
 * this module only ever makes the common case faster. Why C: with several reader threads on
 * few cores the Python around each copy is what they queue for (the GIL); see memory.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyObject *s_whole, *s_freed, *s_head, *s_header_bytes, *s_header, *s_append;

/* [header] on success, None where the Python path decides, NULL with an exception set. */
static PyObject *
fast_one(PyObject *index, PyObject *key, PyObject *out, PyObject *touched)
{
    if (!PyDict_Check(index)) {
        PyErr_SetString(PyExc_TypeError, "_fastget: index must be a dict");
        return NULL;
    }
    PyObject *block = PyDict_GetItemWithError(index, key);
    if (block == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(block);
    PyObject *result = NULL;
    PyObject *whole = PyObject_GetAttr(block, s_whole);
    if (whole == NULL)
        goto done;
    if (whole == Py_None) {  /* several slots or encoded: the Python path */
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_buffer src, dst;
    if (PyObject_GetBuffer(whole, &src, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    if (PyObject_GetBuffer(out, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();  /* not a writable contiguous buffer: the Python path decides */
        PyBuffer_Release(&src);
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (dst.len != src.len) {
        result = Py_NewRef(Py_None);
        goto release;
    }
    Py_BEGIN_ALLOW_THREADS
    memcpy(dst.buf, src.buf, (size_t)src.len);
    Py_END_ALLOW_THREADS

    PyObject *freed = PyObject_GetAttr(block, s_freed);
    PyObject *head = PyObject_GetAttr(block, s_head);
    PyObject *written = PyObject_GetAttr(block, s_header_bytes);
    int intact = 0;
    if (freed != NULL && head != NULL && written != NULL && freed == Py_False
        && PyBytes_Check(written)) {
        Py_buffer hv;
        if (PyObject_GetBuffer(head, &hv, PyBUF_C_CONTIGUOUS) == 0) {
            intact = hv.len == PyBytes_GET_SIZE(written)
                     && memcmp(hv.buf, PyBytes_AS_STRING(written), (size_t)hv.len) == 0;
            PyBuffer_Release(&hv);
        }
    }
    Py_XDECREF(freed);
    Py_XDECREF(head);
    Py_XDECREF(written);
    if (PyErr_Occurred())
        goto release;
    if (!intact) {
        result = Py_NewRef(Py_None);
        goto release;
    }
    PyObject *appended = PyObject_CallMethodOneArg(touched, s_append, key);
    if (appended == NULL)
        goto release;
    Py_DECREF(appended);
    PyObject *header = PyObject_GetAttr(block, s_header);
    if (header == NULL)
        goto release;
    result = PyList_New(1);
    if (result == NULL) {
        Py_DECREF(header);
        goto release;
    }
    PyList_SET_ITEM(result, 0, header);
release:
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
done:
    Py_XDECREF(whole);
    Py_DECREF(block);
    return result;
}

static PyObject *
get1(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "get1(index, key, out, touched) takes 4 arguments");
        return NULL;
    }
    return fast_one(args[0], args[1], args[2], args[3]);
}

/* get_many(index, touched, touch_max, drain, slow, keys, outs): a whole get_many_into call.
 * A one-block request the fast path serves returns [header] (calling drain() once touched
 * holds more than touch_max keys); anything else returns slow(keys, outs). Bound with
 * functools.partial as the tier's get_many_into, so a one-block read runs no Python at all. */
static PyObject *
get_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "get_many(index, touched, touch_max, drain, slow, keys, outs) takes 7 "
                        "arguments");
        return NULL;
    }
    PyObject *touched = args[1], *keys = args[5], *outs = args[6];
    if (PyList_CheckExact(keys) && PyList_CheckExact(outs) && PyList_GET_SIZE(keys) == 1
        && PyList_GET_SIZE(outs) == 1) {
        PyObject *key = Py_NewRef(PyList_GET_ITEM(keys, 0));  /* the GIL is let go meanwhile */
        PyObject *out = Py_NewRef(PyList_GET_ITEM(outs, 0));
        PyObject *got = fast_one(args[0], key, out, touched);
        Py_DECREF(key);
        Py_DECREF(out);
        if (got != Py_None) {
            if (got != NULL) {
                Py_ssize_t queued = PyObject_Length(touched);
                Py_ssize_t most = PyLong_AsSsize_t(args[2]);
                if (queued < 0 || (most == -1 && PyErr_Occurred())) {
                    Py_DECREF(got);
                    return NULL;
                }
                if (queued > most) {
                    PyObject *done = PyObject_CallNoArgs(args[3]);
                    if (done == NULL) {
                        Py_DECREF(got);
                        return NULL;
                    }
                    Py_DECREF(done);
                }
            }
            return got;
        }
        Py_DECREF(got);
    }
    PyObject *both[2] = {keys, outs};
    return PyObject_Vectorcall(args[4], both, 2, NULL);
}

static PyMethodDef methods[] = {
    {"get1", (PyCFunction)(void (*)(void))get1, METH_FASTCALL,
     "get1(index, key, out, touched) -> [header] | None: the memory tier's one-block read."},
    {"get_many", (PyCFunction)(void (*)(void))get_many, METH_FASTCALL,
     "get_many(index, touched, touch_max, drain, slow, keys, outs): get_many_into, one-block "
     "reads in C, the rest through slow(keys, outs)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastget", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__fastget(void)
{
    s_whole = PyUnicode_InternFromString("whole");
    s_freed = PyUnicode_InternFromString("freed");
    s_head = PyUnicode_InternFromString("head");
    s_header_bytes = PyUnicode_InternFromString("header_bytes");
    s_header = PyUnicode_InternFromString("header");
    s_append = PyUnicode_InternFromString("append");
    if (!s_whole || !s_freed || !s_head || !s_header_bytes || !s_header || !s_append)
        return NULL;
    return PyModule_Create(&module);
}
