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

static PyObject *
get1(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "get1(index, key, out, touched) takes 4 arguments");
        return NULL;
    }
    if (!PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "get1: index must be a dict");
        return NULL;
    }
    PyObject *block = PyDict_GetItemWithError(args[0], args[1]);
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
    if (PyObject_GetBuffer(args[2], &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
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
    PyObject *appended = PyObject_CallMethodOneArg(args[3], s_append, args[1]);
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

static PyMethodDef methods[] = {
    {"get1", (PyCFunction)(void (*)(void))get1, METH_FASTCALL,
     "get1(index, key, out, touched) -> [header] | None: the memory tier's one-block read."},
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
