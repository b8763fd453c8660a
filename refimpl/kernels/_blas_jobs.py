"""OpenBLAS's jobs of one threaded call in a Numba prange (kernels/blas_threads.py, shared(omp=True)).

    par_jobs(dojob, slot, jobdata, elsize, dojob_data, numjobs)
        job i = dojob(slot + i, jobdata + i * elsize, dojob_data) for i < numjobs, one prange iteration each;
        the caller makes sure that every job gets a thread of its own at once (numjobs <= Numba's threads)

dojob is called through its address (`_call_job`): the function is a run-time argument, so the driver caches
on disk like the other kernels.
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, prange, types
from numba.core.extending import intrinsic


@intrinsic
def _call_job(typingctx, fp, thread_num, jobdata, dojob_data):
    """dojob(int thread_num, void *jobdata, int dojob_data) through its address fp; all arguments ints."""
    args = (fp, thread_num, jobdata, dojob_data)
    if not all(isinstance(t, types.Integer) for t in args):
        return None

    def codegen(context, builder, sig, vals):
        i32, i8p = ir.IntType(32), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32, i8p, i32])
        v = [context.cast(builder, x, t, types.int64) for x, t in zip(vals, sig.args)]
        builder.call(builder.inttoptr(v[0], fnty.as_pointer()),
                     [builder.trunc(v[1], i32), builder.inttoptr(v[2], i8p), builder.trunc(v[3], i32)])
        return context.get_dummy_value()
    return types.void(*args), codegen


@njit(cache=True, parallel=True, nogil=True)
def par_jobs(fp, slot, jobdata, elsize, dojob_data, numjobs):
    for i in prange(numjobs):
        _call_job(fp, slot + i, jobdata + i * elsize, dojob_data)
